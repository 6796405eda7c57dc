"""Distributed training: the global contrastive set, ACL-Grad's global decision, and a 2-rank
``fairseq-train`` run through ``scripts/ddp_cpu.sh`` (CPU, gloo, loopback only).

The in-process checks run in two worker processes (this file, run as a script with ``--worker``),
started once per module; each builds the task, model and criteria as fairseq-train would, with the
same seed on every rank, and compares a 2-rank step on a split batch with one process on the whole
batch. The workers write their measurements to JSON; the tests below read them.
"""
import json
import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, when run as a worker
import helpers  # noqa: E402

WORLD = 2
BATCH = 8
TOL = 1e-5

# name -> (criterion, arch, extra flags, rows of rank 0 (rank 1 gets the rest)). Each scenario compares
# its criterion with --contrast-across-workers (plus --acl-grad-global-decision where gated) on 2 ranks
# against the same criterion without them, in one process on the whole batch.
SCENARIOS = {
    "scl": ("sentence_scl", "roberta", [], 5),
    "scl_head_multi": ("sentence_scl", "multi_exit_roberta", ["--scl-feature", "head"], 3),
    "embed": ("acl_embed", "roberta", [], 5),
    "embed_multi": ("acl_embed", "multi_exit_roberta", [], 4),
    "grad_params": ("acl_grad", "roberta", ["--acl-grad-scope", "params"], 5),
    "grad_features": ("acl_grad", "multi_exit_roberta", ["--acl-grad-scope", "features"], 3),
    "cross_layer": ("acl_cross_layer", "multi_exit_roberta", [], 4),
}
GATED = {"acl_grad", "acl_cross_layer"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the worker (one per rank) ----


def _parse(data, criterion, arch, extra):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = helpers.train_args(data, "/nonexistent", criterion=criterion, arch=arch, extra=extra,
                              task="sentence_prediction_acl")
    parser = options.get_training_parser()
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, input_args=argv))


def _step(model, crit, sample):
    """One forward/backward: ``{loss, n, log_loss, [grad_cos, conflict]}`` and ``{name: grad}``."""
    model.zero_grad(set_to_none=True)
    loss, n, log = crit(model, sample)
    loss.backward()
    grads = {k: p.grad.detach().clone() for k, p in model.named_parameters() if p.grad is not None}
    out = {"loss": loss.item(), "n": n, "log_loss": float(log["loss"])}
    out.update({k: float(log[k]) for k in ("grad_cos", "conflict") if k in log})
    return out, grads


def _prepare(data, name, rank):
    """Before any process group exists: build everything, take the single-process references."""
    import copy

    import torch
    from fairseq import tasks
    from omegaconf import open_dict

    criterion, arch, extra, n0 = SCENARIOS[name]
    dist_flags = ["--contrast-across-workers"] + (["--acl-grad-global-decision"] if criterion in GATED else [])
    cfg = _parse(data, criterion, arch, extra + dist_flags)
    ref_cfg = copy.deepcopy(cfg.criterion)
    with open_dict(ref_cfg):
        ref_cfg.contrast_across_workers = False
        if criterion in GATED:
            ref_cfg.acl_grad_global_decision = False
    torch.manual_seed(0)  # identical init on every rank
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    crit_dist, crit_ref = task.build_criterion(cfg.criterion), task.build_criterion(ref_cfg)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    rows = list(range(n0)) if rank == 0 else list(range(n0, BATCH))
    full = ds.collater([ds[i] for i in range(BATCH)])
    local = ds.collater([ds[i] for i in rows])  # padded on its own, as a rank's batch would be
    model.train()  # dropout is 0 in these tiny models: the forward is deterministic
    ref, ref_grads = _step(model, crit_ref, full)  # one process, the concatenated batch
    loc, _ = _step(model, crit_ref, local)  # one process, this rank's rows only
    # a replayed batch: rank 1 runs out of data and fairseq replays rows it saw before, loss zeroed
    real = ds.collater([ds[i] for i in range(n0)])
    replay = ds.collater([ds[i] for i in range(n0, BATCH)]) if rank == 1 else real
    real_ref, real_ref_grads = _step(model, crit_ref, real)  # one process, the real rows only
    return dict(model=model, task=task, crit_dist=crit_dist, crit_ref=crit_ref, local=local, ref=ref,
                ref_grads=ref_grads, loc=loc, replay=replay, real_ref=real_ref, real_ref_grads=real_ref_grads)


def _distributed(p):
    """The 2-rank step: fairseq sums the gradients over ranks and divides by the total sample size."""
    import torch
    import torch.distributed as dist

    res, grads = _step(p["model"], p["crit_dist"], p["local"])
    off, _ = _step(p["model"], p["crit_ref"], p["local"])  # flags off, inside the 2-rank world
    sums = torch.tensor([float(res["n"]), res["log_loss"], off["log_loss"]], dtype=torch.float64)
    dist.all_reduce(sums)
    total, ref_n = sums[0].item(), p["ref"]["n"]
    assert set(grads) == set(p["ref_grads"]), sorted(set(grads) ^ set(p["ref_grads"]))
    diff = 0.0
    for k in sorted(grads):
        g = grads[k]
        dist.all_reduce(g)
        diff = max(diff, (g / total - p["ref_grads"][k] / ref_n).abs().max().item())
    return {
        "dist": res,
        "off": off,
        "ref": p["ref"],
        "loc": p["loc"],
        "total": total,
        "summed_log_loss": sums[1].item(),
        "summed_off_log_loss": sums[2].item(),
        "grad_max_diff": diff,
        "grad_scale": max(g.abs().max().item() for g in p["ref_grads"].values()) / ref_n,
        "real_ref": p["real_ref"],
    }


class _Backward:
    """What ``task.train_step`` needs of fairseq's optimizer here: a plain backward."""

    def backward(self, loss):
        loss.backward()


def _replayed(p, rank):
    """One update where rank 1 replays a dummy batch, as ``Trainer.train_step`` runs it: the task
    step with ``ignore_grad``, the sample size zeroed, gradients summed and divided by the total."""
    import torch
    import torch.distributed as dist

    model, crit = p["model"], p["crit_dist"]
    model.zero_grad(set_to_none=True)
    _, n, log = p["task"].train_step(p["replay"], model, crit, _Backward(), 0, ignore_grad=rank == 1)
    total = torch.tensor([0.0 if rank == 1 else float(n)])
    dist.all_reduce(total)
    grads = {k: q.grad.detach().clone() for k, q in model.named_parameters() if q.grad is not None}
    diff = 0.0
    for k in sorted(p["real_ref_grads"]):
        g = grads.get(k, torch.zeros_like(p["real_ref_grads"][k]))
        dist.all_reduce(g)
        diff = max(diff, (g / total.item() - p["real_ref_grads"][k] / p["real_ref"]["n"]).abs().max().item())
    out = {"grad_max_diff": diff, "total": total.item(), "n_contrast_logged": float(log["loss"])}
    out.update({k: float(log[k]) for k in ("grad_cos", "conflict") if k in log})
    return out


def _worker(rank: int, port: int, data: str, out_dir: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    prepared = {name: _prepare(data, name, rank) for name in SCENARIOS}
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120)
    )
    results = {name: _distributed(p) for name, p in prepared.items()}
    for name, p in prepared.items():
        results[name]["replayed"] = _replayed(p, rank)
    dist.barrier()
    dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(results, f, indent=1)


# ---------------------------------------------------------------------------- fixtures ------


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return helpers.make_data(str(tmp_path_factory.mktemp("ddp") / "data"))["data"]


@pytest.fixture(scope="module")
def ranks(data, tmp_path_factory):
    """Both workers' measurements: ``[rank0 results, rank1 results]``."""
    out = str(tmp_path_factory.mktemp("ddp_out"))
    port = _free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", GLOO_SOCKET_IFNAME="lo")
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--worker", str(r), str(port), data, out],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=helpers.REPO,
        )
        for r in range(WORLD)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:  # only our own two workers, by handle
            if p.poll() is None:
                p.kill()
                p.wait()
    for r, (p, text) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"worker {r} failed ({p.returncode}):\n{text[-6000:]}"
    results = []
    for r in range(WORLD):
        with open(os.path.join(out, f"rank{r}.json")) as f:
            results.append(json.load(f))
    return results


# ------------------------------------------------------------------------------- tests ------


def _close(a, b, tol=TOL):
    return abs(a - b) <= tol * max(1.0, abs(b))


@pytest.mark.parametrize("name", ["scl", "scl_head_multi", "embed", "embed_multi"])
def test_global_contrast_equals_one_process_on_the_concatenated_batch(ranks, name):
    """Uneven (5+3, 3+5) and even (4+4) splits: summed logged loss and averaged gradients match."""
    for r, res in enumerate(ranks):
        s = res[name]
        assert s["total"] == BATCH and s["dist"]["n"] == s["loc"]["n"]
        assert _close(s["summed_log_loss"], s["ref"]["log_loss"]), (r, s)
        assert s["grad_scale"] > 1e-4  # the comparison is not vacuous
        assert s["grad_max_diff"] <= TOL, (r, s)
        # the gathered loss is not the local one: the global set changes the contrastive term
        assert abs(s["dist"]["log_loss"] - s["loc"]["log_loss"]) > 1e-4


@pytest.mark.parametrize("name", ["scl", "embed_multi", "grad_params"])
def test_without_the_gather_each_rank_contrasts_its_own_batch(ranks, name):
    """Flags off in a 2-rank world: each rank's loss is the single-process loss of its own rows."""
    for r, res in enumerate(ranks):
        s = res[name]
        assert s["off"]["n"] == (SCENARIOS[name][3] if r == 0 else BATCH - SCENARIOS[name][3])
        assert _close(s["off"]["loss"], s["loc"]["loss"]), (r, s)
        assert _close(s["off"]["log_loss"], s["loc"]["log_loss"]), (r, s)
    # and the sum of the local losses is not the global one (the contrastive sets differ)
    s = ranks[0][name]
    assert abs(s["summed_off_log_loss"] - s["ref"]["log_loss"]) > 1e-4


@pytest.mark.parametrize("name", ["grad_params", "grad_features", "cross_layer"])
def test_global_acl_grad_decision_equals_the_single_process_one(ranks, name):
    for r, res in enumerate(ranks):
        s = res[name]
        assert abs(s["dist"]["grad_cos"] - s["ref"]["grad_cos"]) <= TOL, (r, s)
        assert s["dist"]["conflict"] == s["ref"]["conflict"], (r, s)
        # the same decision on every rank, so the applied update is the single-process one too
        assert s["grad_max_diff"] <= TOL, (r, s)
        assert _close(s["summed_log_loss"], s["ref"]["log_loss"]), (r, s)
    assert ranks[0][name]["dist"]["grad_cos"] == ranks[1][name]["dist"]["grad_cos"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_replayed_batch_is_neither_contrasted_nor_counted(ranks, name):
    """Uneven batch counts: rank 1 replays a dummy batch (loss * 0, as fairseq does when it runs out
    of data). The update equals one process's on rank 0's real rows alone, and a global ACL-Grad
    decision is that process's decision."""
    for r, res in enumerate(ranks):
        s = res[name]["replayed"]
        assert s["total"] == SCENARIOS[name][3]
        assert s["grad_max_diff"] <= TOL, (r, s)
        if SCENARIOS[name][0] in GATED:
            assert abs(s["grad_cos"] - res[name]["real_ref"]["grad_cos"]) <= TOL, (r, s)
            assert s["conflict"] == res[name]["real_ref"]["conflict"], (r, s)


@pytest.mark.parametrize("name", ["grad_params", "grad_features", "cross_layer"])
def test_default_acl_grad_decision_is_local_to_each_rank(ranks, name):
    for r, res in enumerate(ranks):
        s = res[name]
        assert abs(s["off"]["grad_cos"] - s["loc"]["grad_cos"]) <= TOL, (r, s)
    assert ranks[0][name]["off"]["grad_cos"] != ranks[1][name]["off"]["grad_cos"]


def test_gather_is_identity_outside_distributed_training():
    import torch

    from acl_torch import distributed
    from acl_torch.exit_heads import ExitOutputs

    u = torch.randn(3, 4, requires_grad=True)
    exits = ExitOutputs([u[:, :2]], [u], [u], [torch.randn(2, 4)], [1])
    t = torch.tensor([0, 1, 1])
    out, targets, n = distributed.gather_for_contrast(exits, t)
    assert out is exits and targets is t and n == 3
    w = torch.randn(2, 4, requires_grad=True)
    scaled = distributed.scale_grad(w, 0.5)
    scaled.sum().backward()
    assert torch.equal(scaled, w) and torch.allclose(w.grad, torch.full_like(w, 0.5))


# slow: two fairseq-train ranks through scripts/ddp_cpu.sh, about 6 s idle (13 s on a loaded machine); make test
# keeps the two-rank checks above (the global contrastive set and decision, a replayed batch) on real gloo ranks
@pytest.mark.slow
def test_two_rank_fairseq_train_with_the_cpu_launcher(tmp_path):
    """acl_cross_layer on a tiny multi_exit_roberta, global contrastive set, to the end of training.
    3 batches over 2 ranks: in the second update rank 1 has none left and fairseq replays a dummy."""
    data = helpers.make_data(str(tmp_path / "data"), n_train=20)["data"]  # batches of 8, 8 and 4
    save = tmp_path / "ckpt"
    args = helpers.train_args(
        data,
        str(save),
        criterion="acl_cross_layer",
        arch="multi_exit_roberta",
        model_args=helpers.TINY_ROBERTA,
        extra=["--contrast-across-workers", "--acl-grad-global-decision"],
        task="sentence_prediction_acl",
    )
    logs = tmp_path / "logs"
    cmd = [
        "bash", os.path.join(helpers.REPO, "scripts", "ddp_cpu.sh"),
        "--port", str(_free_port()), "--log-dir", str(logs), str(WORLD), "--",
        sys.executable, "-m", "fairseq_cli.train", *args,
    ]
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=helpers.REPO, timeout=240)
    rank1 = (logs / "rank1.log").read_text() if (logs / "rank1.log").exists() else ""
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}\nrank 1:\n{rank1[-3000:]}"
    assert (save / "checkpoint_last.pt").exists() and (save / "checkpoint_best.pt").exists()
    out = proc.stdout + proc.stderr
    assert "distributed init (rank 0)" in out and "distributed init (rank 1)" in rank1
    assert "all 2 ranks finished" in proc.stderr
    # 3 batches sharded over 2 ranks: 2 updates in the epoch, the second with a replayed batch on rank 1
    assert '"num_updates": "2"' in out, out[-3000:]


if __name__ == "__main__" and len(sys.argv) == 6 and sys.argv[1] == "--worker":
    sys.path.insert(0, helpers.REPO)
    _worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
