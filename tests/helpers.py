"""Small versions of fairseq's test helpers (not shipped in its wheel): tiny data, tiny models, and
``fairseq-train --user-dir acl_fairseq`` runs in a subprocess (a fresh registry per run, as a user
would run it)."""
import os
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "acl_fairseq")

# The tests' tiny encoder: odd, distinct sizes so that swapped axes fail loudly (fairseq/BERT tester
# habit). The plugin registers no tiny preset, so every tiny run passes these flags, with --arch roberta
# or multi_exit_roberta. (benchmarks/common.py keeps its own "tiny" entry of the same shape: benchmarks
# import nothing from tests/.)
TINY_SHAPE = [
    "--encoder-layers", "3",
    "--encoder-embed-dim", "12",
    "--encoder-ffn-embed-dim", "20",
    "--encoder-attention-heads", "4",
]
# ... with short positions and no dropout, where values are compared
TINY_ROBERTA = [
    *TINY_SHAPE,
    "--max-positions", "64",
    "--dropout", "0.0",
    "--attention-dropout", "0.0",
]


def make_data(out_dir: str, **kw) -> Dict[str, object]:
    """Generate and binarize the toy task (see ``make_toy_dataset`` in scripts/toy_data.py)."""
    from toy_data import make_toy_dataset

    kw.setdefault("n_train", 48)
    kw.setdefault("n_valid", 24)
    return make_toy_dataset(out_dir, **kw)


def raw_split(data: str, split: str = "valid"):
    """(texts, labels) of the toy data's raw split, as preprocessing read them."""
    raw = os.path.join(data, "raw")
    a = open(os.path.join(raw, f"{split}.input0")).read().splitlines()
    b_path = os.path.join(raw, f"{split}.input1")
    texts = list(zip(a, open(b_path).read().splitlines())) if os.path.isfile(b_path) else a
    return texts, open(os.path.join(raw, f"{split}.label")).read().splitlines()


def train_args(
    data: str,
    save_dir: str,
    criterion: str = "sentence_ce",
    arch: str = "roberta",
    num_classes: int = 2,
    extra: Sequence[str] = (),
    max_epoch: int = 1,
    model_args: Sequence[str] = tuple(TINY_ROBERTA),
    task: str = "sentence_prediction",
) -> List[str]:
    """The argument list of a CPU ``fairseq-train`` run of a tiny model through the plugin.

    ``--required-batch-size-multiple 1``: fairseq otherwise drops a last validation batch whose size
    is not a multiple of 8 under the stock task. The task flags of the input layout are RoBERTa's
    (:func:`acl_runtime.conventions.input_layout`).
    """
    from acl_runtime import conventions

    return [
        data,
        "--user-dir", USER_DIR,
        "--task", task,
        *conventions.input_layout().fairseq_flags(),
        "--criterion", criterion,
        "--arch", arch,
        *model_args,
        "--num-classes", str(num_classes),
        "--optimizer", "adam",
        "--lr", "1e-3",
        "--batch-size", "8",
        "--required-batch-size-multiple", "1",
        "--max-epoch", str(max_epoch),
        "--cpu",
        "--seed", "1",
        "--save-dir", save_dir,
        "--no-epoch-checkpoints",
        "--log-format", "json",
        "--log-interval", "1",
        "--num-workers", "0",
        *extra,
    ]


def run_fairseq(module: str, args: Sequence[str], env: Optional[Dict[str, str]] = None, check: bool = True):
    """Run ``python -m <module> <args>`` (e.g. ``fairseq_cli.train``); return the CompletedProcess.

    On failure the assertion message carries the tail of the output, which is what one needs.
    """
    return _run([sys.executable, "-m", module, *args], module, env, check)


def tool(name: str) -> str:
    """The path of one of the package's console scripts (``acl-evaluate``, ...) in this interpreter's
    environment, as ``pip install -e .`` made it."""
    return os.path.join(os.path.dirname(sys.executable), name)


def run_tool(name: str, args: Sequence[str], env: Optional[Dict[str, str]] = None, check: bool = True):
    """Run the console script ``name`` (see :func:`tool`) with ``args``, like :func:`run_fairseq`."""
    return _run([tool(name), *args], name, env, check)


def _run(argv: Sequence[str], what: str, env: Optional[Dict[str, str]], check: bool):
    # `env`, when given, is the whole environment of the child (so a test can also remove variables)
    full_env = dict(os.environ if env is None else env, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=full_env, cwd=REPO)
    if check:
        assert proc.returncode == 0, f"{what} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}"
    return proc


def refusal(main, argv: Sequence[str], prog: str) -> str:
    """The line the command ``prog`` prints when it refuses ``argv``: ``main(argv)`` raises the one-line
    :class:`acl_runtime.console.UsageError` that :func:`acl_runtime.console.run` prints as ``prog: error: ...``
    with exit status 2."""
    from acl_runtime import console

    with pytest.raises(console.UsageError) as refused:
        main(argv)
    assert refused.value.code == 2 and "\n" not in str(refused.value), str(refused.value)
    return f"{prog}: error: {refused.value}"


def train(data: str, save_dir: str, **kw):
    """One tiny ``fairseq-train --user-dir acl_fairseq`` run; returns the CompletedProcess."""
    env = kw.pop("env", None)
    check = kw.pop("check", True)
    return run_fairseq("fairseq_cli.train", train_args(data, save_dir, **kw), env=env, check=check)


def read_scalars(logdir: str) -> Dict[str, Dict[str, List[float]]]:
    """``{run: {tag: [values...]}}`` from the tensorboardX/torch event files under ``logdir``."""
    from tensorboardX.proto import event_pb2  # the event protobuf ships with tensorboardX

    out: Dict[str, Dict[str, List[float]]] = {}
    for root, _, files in os.walk(logdir):
        for name in files:
            if "tfevents" not in name:
                continue
            run = os.path.relpath(root, logdir)
            for record in _records(os.path.join(root, name)):
                ev = event_pb2.Event.FromString(record)
                for v in ev.summary.value:
                    if v.HasField("simple_value"):
                        out.setdefault(run, {}).setdefault(v.tag, []).append(v.simple_value)
    return out


def _records(path: str):
    """Iterate the raw records of a TFRecord file (length, crc, data, crc)."""
    import struct

    with open(path, "rb") as f:
        while True:
            header = f.read(8)
            if len(header) < 8:
                return
            (length,) = struct.unpack("<Q", header)
            f.read(4)
            data = f.read(length)
            f.read(4)
            yield data


def unwritable_folder(tmp_path) -> str:
    """A folder in which this process cannot create files: a read-only folder under ``tmp_path``, or /sys when
    running as root (root ignores permission bits); skips the test where there is none."""

    read_only = os.path.join(str(tmp_path), "read_only")
    os.makedirs(read_only, exist_ok=True)
    os.chmod(read_only, 0o500)
    for folder in (read_only, "/sys"):
        probe = os.path.join(folder, ".acl_fairseq_probe")
        try:
            open(probe, "w").close()
        except OSError:
            return folder
        os.remove(probe)
    pytest.skip("no folder here refuses writes")


NEEDED = "needed here: "  # a skip reason that starts so is a failure under CI=true (conftest.py)
# test_preprocess.py and test_tokenization.py skip with it when ../shared/glue (GLUE_DIR) is absent
NO_REAL_GLUE = NEEDED + "the real GLUE folder (../shared/glue beside the checkout, or GLUE_DIR)"


def skip_needed(what: str, install: str) -> None:
    """Skip for something that .ci/run sets up (a Debian package, the real GLUE files, the packaged MiniLM):
    a skip for ``what`` outside CI, a failure under CI=true, where its absence is a broken machine."""
    pytest.skip(f"{NEEDED}{what} ({install})")


def import_needed(module: str, install: str):
    """``pytest.importorskip`` whose skip :func:`skip_needed` makes a failure under CI=true."""
    try:
        return __import__(module)
    except ImportError:
        skip_needed(f"the Python module {module}", install)


def skip_is_failure_here(reason: str, environ=os.environ) -> bool:
    """Whether a test skipped for ``reason`` fails instead (conftest.py applies it to every test). Under
    ``CI=true`` what .ci/run sets up (the real GLUE files, qemu-user, PostgreSQL, the packaged MiniLM) is part
    of the machine, so a skip for its absence (a reason that starts with :data:`NEEDED`) would let the run pass
    green without the check; other skips (a check that cannot apply here, such as a read-only folder for root)
    stay skips."""
    return reason.startswith(NEEDED) and environ.get("CI", "").strip().lower() in ("true", "1")


HEAVY_TESTS = os.path.join(REPO, "tests", "heavy_tests.tsv")


def mark_heavy(items, table: str = HEAVY_TESTS) -> None:
    """Mark each test its row of ``table`` names (``folder/test_file.py`` or ``folder/test_file.py::test name
    prefix`` -> "fairseq", "server", or "alone", which is a server too): the markers that keep a test out of make
    test-fast, and put it in make test's second phase."""
    from acl_runtime.tables import read_tsv

    tests = os.path.join(REPO, "tests")
    rows = [(row["test"].partition("::"), row["mark"]) for row in read_tsv(table, ["test", "mark"])]
    for item in items:
        where = os.path.relpath(str(item.path), tests)
        for (path, _, prefix), mark in rows:
            if where == path and item.name.startswith(prefix):
                for one in ("server", "alone") if mark == "alone" else (mark,):
                    item.add_marker(one)
