"""The session's tiny trained models, built in one background process while the tests before their first user run.

``make test`` runs on one core: pytest and the tiny models use one thread, and each trained model is a
``fairseq-train`` the tests wait for (5-12 s each). Once collection has ended, :func:`start` runs this file as a
script on the models that the collected tests use, in the order of their first use; each is built here exactly as
its fixture in conftest.py would build it, into the folder of its name, and its result is pickled beside it. A
fixture asks :func:`get`: it waits for that result, and builds the model itself (the same function, in the test's
own process) when the background process is not running, failed on that model, or is gone.

A process of its own, not a thread: the builders run fairseq's preprocessing in-process, and a thread would see a
test's ``monkeypatch`` of ``sys.modules``, the environment or the working directory while it runs.

    python tests/prebuilt.py ROOT NAME [NAME ...]
"""
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
WAIT_SECONDS = 600  # a result not there by then is built in the test's process


# ---- the builders: root (an empty folder) -> the fixture's value -----------------------------------------


def predict_run(root):
    """(root, data, checkpoint): a tiny multi-exit model (mean pooling, every layer an exit) trained 2 epochs on
    toy pairs."""
    import helpers

    data = helpers.make_data(str(root / "data"), pair=True)["data"]
    helpers.train(data, str(root / "ckpt"), criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=helpers.TINY_ROBERTA + ["--exit-pooling", "mean"], max_epoch=2)
    return root, data, str(root / "ckpt" / "checkpoint_best.pt")


def cls_pair_run(root):
    """(data, checkpoint): predict_run's model with [CLS] pooling, trained 2 epochs on toy pairs."""
    import helpers

    data = helpers.make_data(str(root / "data"), pair=True)["data"]
    helpers.train(data, str(root / "ckpt"), criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=helpers.TINY_ROBERTA, max_epoch=2)
    return data, str(root / "ckpt" / "checkpoint_best.pt")


def regression_run(root):
    """(checkpoint, data): a tiny multi-exit model trained 2 epochs on the toy task's [0, 1] scores (no
    label/dict.txt)."""
    import helpers

    data = helpers.make_data(str(root / "data"), regression=True)["data"]
    assert not os.path.exists(os.path.join(data, "label", "dict.txt"))
    helpers.train(data, str(root / "ckpt"), criterion="sentence_ce", arch="multi_exit_roberta", num_classes=1,
                  extra=["--regression-target", "--best-checkpoint-metric", "loss"], max_epoch=2)
    return str(root / "ckpt" / "checkpoint_best.pt"), data


def single_run(root):
    """(data, checkpoint): predict_run's model (mean pooling, every layer an exit) trained 2 epochs on the toy
    task's single sentences: a classifier of one text per input."""
    import helpers

    data = helpers.make_data(str(root / "data"))["data"]
    helpers.train(data, str(root / "ckpt"), criterion="sentence_prediction", arch="multi_exit_roberta",
                  model_args=helpers.TINY_ROBERTA + ["--exit-pooling", "mean"], max_epoch=2)
    return data, str(root / "ckpt" / "checkpoint_best.pt")


def plugin_task_run(root):
    """(data, run folder): a tiny roberta trained one epoch under the plugin task sentence_prediction_acl."""
    import helpers

    data = helpers.make_data(str(root / "data"))["data"]
    helpers.train(data, str(root / "run"), task="sentence_prediction_acl")
    return data, root / "run"


def tiny_bert_rte(root):
    """tiny_hf.bert_on_toy_rte's converted BERT, toy RTE folder and two-update run."""
    import tiny_hf

    return tiny_hf.bert_on_toy_rte(root)


def tiny_bert_mean(root):
    """tiny_hf.bert_on_toy_rte with a two-class head made at conversion and mean pooling."""
    import tiny_hf

    return tiny_hf.bert_on_toy_rte(root, num_classes=2, model_flags=["--exit-pooling", "mean"])


BUILDERS = {f.__name__: f for f in (predict_run, cls_pair_run, regression_run, single_run, plugin_task_run,
                                    tiny_bert_rte, tiny_bert_mean)}


# ---- the session's side ----------------------------------------------------------------------------------


# Under pytest-xdist (make test runs two workers) the controller names one folder for the whole run in this variable
# (tests/conftest.py): the first worker to claim it starts the one background process, the others wait on its files,
# and the controller ends it once every worker is done (stop_shared), so no model is trained twice.
SHARED = "ACL_PREBUILT_SHARED"


class _Background:
    root: Optional[str] = None
    proc: Optional[subprocess.Popen] = None
    pid: Optional[int] = None  # the process another worker started (shared mode)
    names: List[str] = []


def start(items) -> List[str]:
    """Build, in one background process, the models that the collected ``items`` use, first used first."""
    names: List[str] = []
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            if name in BUILDERS and name not in names:
                names.append(name)
    if not names:
        return names
    shared = os.environ.get(SHARED)
    _Background.root, _Background.names = shared or tempfile.mkdtemp(prefix="acl-prebuilt-"), names
    if shared:
        try:
            os.close(os.open(os.path.join(shared, "owner"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # another worker started it: wait on its files
            _Background.pid = _read_pid(shared)
            return names
    log = open(os.path.join(_Background.root, "log.txt"), "w")
    _Background.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), _Background.root, *names],
                                        stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                        env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"))
    log.close()
    if shared:
        with open(os.path.join(shared, "pid.tmp"), "w") as f:
            f.write(str(_Background.proc.pid))
        os.replace(os.path.join(shared, "pid.tmp"), os.path.join(shared, "pid"))
    return names


def _read_pid(root: str, seconds: float = 30.0) -> Optional[int]:
    """The shared background process's pid, once its starter has written it (None if it never does)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with open(os.path.join(root, "pid")) as f:
                return int(f.read())
        except (OSError, ValueError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


def _running() -> bool:
    if _Background.proc is not None:
        return _Background.proc.poll() is None
    pid = _Background.pid
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has finished
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def stop() -> None:
    """End the background process (a run cut short leaves it building) and remove its folder; in shared mode the
    controller does that (stop_shared), as another worker may still wait on it."""
    proc, root = _Background.proc, _Background.root
    if os.environ.get(SHARED):
        _Background.proc = _Background.root = _Background.pid = None
        return
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
    _Background.proc = _Background.root = None


def stop_shared(root: str) -> None:
    """The controller's end of a shared run: the background process killed if still building, its folder removed."""
    pid = _read_pid(root, seconds=0)
    if pid is not None:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    shutil.rmtree(root, ignore_errors=True)


def get(name: str, tmp_path_factory):
    """The value of the model ``name``: the background process's, or built here (see the module's docstring)."""
    from pathlib import Path

    root = _Background.root
    if (_Background.proc is not None or _Background.pid is not None) and name in _Background.names:
        done, failed = os.path.join(root, name + ".pickle"), os.path.join(root, name + ".failed")
        deadline = time.monotonic() + WAIT_SECONDS
        while not (os.path.exists(done) or os.path.exists(failed)) and time.monotonic() < deadline:
            if not _running() and not os.path.exists(done):
                break
            time.sleep(0.05)
        if os.path.exists(done):
            with open(done, "rb") as f:
                return pickle.load(f)
    return BUILDERS[name](Path(tmp_path_factory.mktemp(name)))


def main(argv: List[str]) -> int:
    """Build each named model into ROOT/NAME; ROOT/NAME.pickle once it is whole, ROOT/NAME.failed if not."""
    from pathlib import Path

    for path in (HERE, REPO, os.path.join(REPO, "scripts")):
        sys.path.insert(0, path)
    import torch

    from acl_runtime.io import atomic

    torch.set_num_threads(1)
    root, names = argv[0], argv[1:]
    for name in names:
        try:
            os.makedirs(os.path.join(root, name))
            value = BUILDERS[name](Path(root) / name)
        except BaseException:  # the fixture builds it again in the test's process, and reports the error there
            with open(os.path.join(root, name + ".failed"), "w") as f:
                f.write(traceback.format_exc())
            continue
        atomic.write_bytes(os.path.join(root, name + ".pickle"), pickle.dumps(value))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
