"""Monitoring: validation alignment scalars and projector snapshots in TensorBoard (task
``sentence_prediction_acl``), the alignment metric on a known geometry, and the early-exit overlay
figure (``acl_fairseq.inference.report.plot_overlay``) as a valid PNG."""
import json
import math
import os
import re

import pytest
import torch

import helpers
from acl_fairseq import projector
from acl_fairseq.inference import report
from acl_torch import alignment

SAMPLES = 10
TINY = ["--task", "sentence_prediction_acl", "--projector-samples", str(SAMPLES)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("monitoring") / "data"))["data"]


def _valid_stats(proc) -> dict:
    """The last ``valid`` JSON line of a fairseq-train run."""
    lines = re.findall(r"\| valid \| (\{.*\})", proc.stdout + proc.stderr)
    assert lines, (proc.stdout + proc.stderr)[-3000:]
    return json.loads(lines[-1])


def _pbtxt_entries(path: str):
    """(tensor_name, tensor_path, metadata_path) of each ``embeddings { }`` block."""
    text = open(path).read()
    blocks = re.findall(r"embeddings \{(.*?)\n\}", text, flags=re.S)
    return [
        tuple(re.search(rf'{key}: "([^"]*)"', b).group(1) for key in ("tensor_name", "tensor_path", "metadata_path"))
        for b in blocks
    ]


@pytest.fixture(scope="module")
def plugin_run(data, tmp_path_factory):
    """(fairseq-train's CompletedProcess, TensorBoard dir): acl_cross_layer under the plugin task with a projector
    snapshot every epoch; read by the test below and by the slow comparison with the stock task."""
    root = tmp_path_factory.mktemp("plugin_run")
    tb = root / "tb"
    proc = helpers.train(
        data, str(root / "ck"), criterion="acl_cross_layer", arch="multi_exit_roberta",
        model_args=helpers.TINY_SHAPE,
        extra=[*TINY, "--projector-every", "1", "--tensorboard-logdir", str(tb)],
    )
    return proc, tb


def test_train_logs_alignment_scalars_and_one_projector_snapshot_per_exit(plugin_run):
    proc, tb = plugin_run
    log = proc.stdout + proc.stderr
    assert "acl_fairseq.tasks.sentence_prediction_acl" in log  # the later --task won over helpers' stock one

    valid = helpers.read_scalars(str(tb))["valid"]
    for layer in (1, 2, 3):
        for name in ("align_own", "align_other", "align_gap"):
            assert f"{name}_exit{layer}" in valid, sorted(valid)
            assert all(-1.0 <= v <= 1.0 or name == "align_gap" for v in valid[f"{name}_exit{layer}"])
        gap = valid[f"align_gap_exit{layer}"][-1]
        assert gap == pytest.approx(valid[f"align_own_exit{layer}"][-1] - valid[f"align_other_exit{layer}"][-1],
                                    abs=2e-4)
    assert {"align_to_last_exit1", "align_to_last_exit2"} <= set(valid)
    assert "align_to_last_exit3" not in valid  # the last exit is the reference

    step = int(_valid_stats(proc)["valid_num_updates"])
    pdir = tb / "projector"
    entries = _pbtxt_entries(str(pdir / "projector_config.pbtxt"))
    assert [e[0] for e in entries] == [f"exit{layer}:{step:05d}" for layer in (1, 2, 3)]
    num_labels = 2
    ids = []
    for layer, (_, tensor_path, metadata_path) in zip((1, 2, 3), entries):
        tensors = [line for line in open(pdir / tensor_path).read().splitlines() if line.strip()]
        meta = [line.split("\t") for line in open(pdir / metadata_path).read().splitlines() if line.strip()]
        assert len(tensors) == SAMPLES + num_labels
        assert meta[0] == projector.METADATA_HEADER and len(meta) - 1 == SAMPLES + num_labels
        rows = [dict(zip(meta[0], r)) for r in meta[1:]]
        assert [r["kind"] for r in rows] == ["sample"] * SAMPLES + ["label embedding"] * num_labels
        assert {r["gold"] for r in rows} <= {"0", "1"} and {r["predicted"] for r in rows} <= {"0", "1"}
        assert {r["gold"] for r in rows[SAMPLES:]} == {"0", "1"}
        assert {r["exit_layer"] for r in rows} == {str(layer)}
        vectors = [[float(x) for x in line.split("\t")] for line in tensors]
        assert {len(v) for v in vectors} == {12}  # the tiny model's head width
        assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-3 for v in vectors)  # unit rows
        ids.append([r["id"] for r in rows[:SAMPLES]])
        snap = projector.read_snapshot(str(pdir), step, f"exit{layer}")
        assert len(snap["tensors"]) == len(snap["metadata"]) == SAMPLES + num_labels
    assert ids[0] == ids[1] == ids[2] and len(set(ids[0])) == SAMPLES  # the same fixed sample per exit


# slow: a second fairseq-train run, about 6 s idle (13 s on a loaded machine); make test keeps the plugin task's
# run above and test_task.py's in-process checks of what the plugin task changes (every validation example kept,
# replayed batches marked)
@pytest.mark.slow
def test_the_plugin_task_is_a_drop_in_replacement_for_the_stock_one(plugin_run, data, tmp_path):
    """The stock task's run gives the same validation numbers as the plugin task's."""
    proc, _ = plugin_run
    stock = helpers.train(data, str(tmp_path / "ck_stock"), criterion="acl_cross_layer",
                          arch="multi_exit_roberta", model_args=helpers.TINY_SHAPE)
    timing = ("valid_wps", "valid_wpb", "valid_bsz", "valid_wall")
    ours, theirs = _valid_stats(proc), _valid_stats(stock)
    assert {k: v for k, v in ours.items() if k not in timing} == {k: v for k, v in theirs.items() if k not in timing}


def test_projector_refuses_without_a_log_dir(tmp_path, data):
    """fairseq-train's own config path (argparse -> OmegaConf -> task setup), in process: refused at
    task setup, before any training, with a message that names the fix."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import acl_fairseq.tasks  # noqa: F401  (fairseq skips a user dir's tasks/ if the package is already imported)

    def task_cfg(extra):
        args = helpers.train_args(data, str(tmp_path / "ck"), criterion="acl_cross_layer",
                                  arch="multi_exit_roberta", model_args=helpers.TINY_SHAPE, extra=[*TINY, *extra])
        return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args)).task

    with pytest.raises(ValueError, match="no log dir is known: pass --tensorboard-logdir DIR"):
        tasks.setup_task(task_cfg(["--projector-every", "1"]))
    task = tasks.setup_task(task_cfg(["--projector-every", "1", "--tensorboard-logdir", str(tmp_path / "tb")]))
    assert task.projector_logdir == str(tmp_path / "tb" / "projector")
    task = tasks.setup_task(task_cfg(["--projector-every", "1", "--projector-logdir", str(tmp_path / "p")]))
    assert task.projector_logdir == str(tmp_path / "p")
    assert tasks.setup_task(task_cfg([])).projector_logdir is None  # off by default: nothing needed

    with pytest.raises(ValueError, match="--projector-logdir"):
        projector.resolve_logdir(None, "${common.tensorboard_logdir}")  # an unresolved interpolation
    assert projector.resolve_logdir(None, "/tb") == os.path.join("/tb", "projector")
    assert projector.resolve_logdir("/p", "/tb") == "/p"


def test_projector_sample_is_seeded_and_capped():
    a = projector.choose_indices(100, 10, seed=3)
    assert a == projector.choose_indices(100, 10, seed=3) != projector.choose_indices(100, 10, seed=4)
    assert len(set(a)) == 10 and a == sorted(a) and all(0 <= i < 100 for i in a)
    assert projector.choose_indices(5, 256, seed=0) == [0, 1, 2, 3, 4]


def test_snapshot_rows_normalize_and_name_the_points():
    u = torch.tensor([[3.0, 0.0], [0.0, -2.0], [1.0, 1.0]])
    w = torch.tensor([[0.0, 5.0], [7.0, 0.0]])
    logits = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.4]])
    snap = projector.snapshot_rows(4, u, w, logits, torch.tensor([1, 0, 0]), [7, 2, 9], ["pos", "neg"])
    assert snap.tag == "exit4" and snap.mat.shape == (5, 2)
    assert torch.allclose(torch.tensor(snap.mat).norm(dim=1), torch.ones(5).double(), atol=1e-4)
    assert snap.metadata[0] == ["sample", "neg", "neg", "4", "7"]
    assert snap.metadata[1] == ["sample", "pos", "pos", "4", "2"]
    assert snap.metadata[3:] == [["label embedding", "pos", "pos", "4", "-"],
                                 ["label embedding", "neg", "neg", "4", "-"]]

    reg = projector.snapshot_rows(2, u, w[:1], logits[:, :1], torch.tensor([[0.25], [1.0], [0.5]]), [0, 1, 2], [],
                                  regression=True)  # STS-B-like: scores, one head row
    assert reg.mat.shape == (4, 2) and reg.metadata[0] == ["sample", "0.250", "0.100", "2", "0"]
    assert reg.metadata[3] == ["label embedding", "score", "score", "2", "-"]


def test_alignment_sums_on_orthogonal_label_embeddings():
    s = 1 / math.sqrt(2)
    w = torch.diag(torch.tensor([2.0, 0.5, 3.0]))  # orthogonal label embeddings, arbitrary norms
    u = torch.tensor([[4.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, -1.0]])
    labels = torch.tensor([0, 1, 2])
    sums = alignment.label_alignment_sums(u, labels, w)
    # own: cos 1, 1/sqrt2, -1; other (mean over the two other labels): 0, (1/sqrt2 + 0)/2, 0
    assert sums["own"].item() == pytest.approx(1 + s - 1, abs=1e-6)
    assert sums["other"].item() == pytest.approx(s / 2, abs=1e-6)
    assert sums["own"].dtype == torch.float32 and not sums["own"].requires_grad

    one = alignment.label_alignment_sums(u[:1], labels[:1], w[:1])  # K = 1: no other label
    assert one["own"].item() == pytest.approx(1.0) and one["other"].item() == 0.0

    shallow = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [2.0, 2.0, 0.0]], requires_grad=True)
    last = torch.tensor([[5.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 1.0, 0.0]])
    agree = alignment.exit_agreement_sum(shallow, last)  # cos 1, -1, 1/sqrt2
    assert agree.item() == pytest.approx(s, abs=1e-6) and not agree.requires_grad


def _result(seed: int, shift: float) -> dict:
    """A hand-written early_exit.json of a 3-layer, 3-exit model (what acl_fairseq.cli.evaluate writes)."""
    per_exit = [{"layer": layer, "metrics": {"accuracy": a + shift + seed}}
                for layer, a in ((1, 60.0), (2, 70.0), (3, 80.0))]
    settings = []
    for policy, thresholds in (("entropy", (0.2, 0.5, 0.8)), ("patience", (1, 2))):
        for i, t in enumerate(thresholds):
            avg = 2.6 - 0.6 * i - 0.05 * seed
            settings.append({
                "policy": policy, "threshold": t, "metrics": {"accuracy": 79.0 - 4 * i + shift + seed},
                "avg_exit_layer": avg, "layer_speedup": 3 / avg, "saved_fraction": 1 - avg / 3,
                "exit_fractions": [0.2, 0.3, 0.5],
            })
    return {"task": "RTE", "split": "valid", "num_layers": 3, "exit_layers": [1, 2, 3], "num_examples": 24,
            "primary_metric": "accuracy", "per_exit": per_exit, "settings": settings}


def test_overlay_figure_is_a_valid_png(tmp_path):
    groups = {}
    for method, shift in (("ce", 0.0), ("acl_cross_layer", 2.0)):
        for seed in (1, 2):
            path = tmp_path / method / f"seed{seed}" / "early_exit.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(_result(seed, shift)))
            groups.setdefault(method, []).append(json.loads(path.read_text()))
    out = tmp_path / "overlay.png"
    report.plot_overlay(groups, str(out))

    raw = out.read_bytes()
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(raw) > 10_000  # two panels with curves, not an empty canvas
    from PIL import Image

    with Image.open(out) as im:
        im.verify()
    with Image.open(out) as im:
        assert im.format == "PNG" and im.size[0] > 400 and im.size[1] > 200
        colors = im.convert("L").getcolors(maxcolors=1 << 16)  # None: more shades than that
        assert colors is None or len(colors) > 2  # something drawn
    import matplotlib.image

    assert matplotlib.image.imread(str(out)).ndim == 3
