import os
import sys
import tempfile

import pytest

# tests import their helpers as `helpers`, the demo's synthetic data as `toy_data` (scripts/toy_data.py) and
# the benchmark scripts by name (`import step_time`, as the scripts import each other): none of them is part of
# the package. acl_fairseq itself is installed (editable) or on the path. The tests live in one folder per subject
# (each with a conftest.py saying what it covers); a test file that builds on another's (`from test_criterions
# import build`) imports it by name from whichever subject holds it, so every subject folder is on the path too
# (file names are unique across subjects).
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SUBJECTS = sorted(d for d in os.listdir(HERE) if os.path.isfile(os.path.join(HERE, d, "conftest.py")))
for _subject in SUBJECTS:
    sys.path.insert(0, os.path.join(HERE, _subject))
sys.path.insert(0, HERE)
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "scripts"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import prebuilt  # noqa: E402  (tests/, on the path above)


def pytest_collection_finish(session):
    """The session's trained models, built in a background process on the core that pytest leaves idle
    (tests/prebuilt.py)."""
    if not session.config.option.collectonly:
        prebuilt.start(session.items)


def pytest_sessionfinish(session):
    prebuilt.stop()


def pytest_unconfigure(config):
    if getattr(config, "prebuilt_shared", None):
        prebuilt.stop_shared(config.prebuilt_shared)
        os.environ.pop(prebuilt.SHARED, None)


def pytest_configure(config):
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        # pytest-xdist's controller: one folder, and one background builder, for every worker (tests/prebuilt.py)
        config.prebuilt_shared = os.environ[prebuilt.SHARED] = tempfile.mkdtemp(prefix="acl-prebuilt-")
    config.addinivalue_line("markers", "slow: tests kept out of make test (real data, or long fairseq-train runs); "
                            "run with -m slow")
    config.addinivalue_line("markers", "fairseq: trains or builds a fairseq model (fairseq-train, a task and model "
                            "built in process, a model the session trains, a fresh interpreter importing fairseq): "
                            "kept out of make test-fast")
    config.addinivalue_line("markers", "server: starts a server (acl-serve, uvicorn, PostgreSQL) or another "
                            "long-lived process: kept out of make test-fast")
    config.addinivalue_line("markers", "alone: real processes under signals or load, whose timing bounds want a core "
                            "to spare: make test runs them in a phase of their own, after the two-worker phase")


# what keeps a test out of make test-fast, besides its row in tests/heavy_tests.tsv: any of the session's trained
# models, or a fixture built on one (pytest lists every fixture a test reaches)
TRAINED = frozenset(prebuilt.BUILDERS)


def pytest_collection_modifyitems(config, items):
    import helpers

    helpers.mark_heavy(items)
    for item in items:
        if TRAINED & set(getattr(item, "fixturenames", ())):
            item.add_marker("fairseq")


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    """In-process torch on one thread, for every test: the tiny models run fastest on one, and on a busy 2-core
    machine a second intra-op thread waits for a core at every op (measured: a 12-wide linear layer took 16 ms
    on two threads, 6 us on one), which made the in-process criterion tests several times slower. The
    subprocesses the tests start get OMP_NUM_THREADS=1 (helpers._run) or set their own."""
    import torch

    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def predict_run(tmp_path_factory):
    """(root, data, checkpoint): a tiny multi-exit model (mean pooling, every layer an exit) trained 2 epochs
    on toy pairs. Trained once for test_predict.py and test_predict_input.py, which only read it."""
    return prebuilt.get("predict_run", tmp_path_factory)


@pytest.fixture(scope="session")
def cls_pair_run(tmp_path_factory):
    """(data, checkpoint): predict_run's model with [CLS] pooling, trained 2 epochs on toy pairs. Trained once
    for test_calibrate.py and test_onnx.py, which only read it (each copies what it changes)."""
    return prebuilt.get("cls_pair_run", tmp_path_factory)


@pytest.fixture(scope="session")
def regression_run(tmp_path_factory):
    """(checkpoint, data): a tiny multi-exit model trained 2 epochs on the toy task's [0, 1] scores (no
    label/dict.txt), a model of one text per input. Trained once for test_export_errors.py, test_pairing.py,
    test_predict_input.py and test_serve_models.py, which only read it (each exports its own ONNX folder)."""
    return prebuilt.get("regression_run", tmp_path_factory)


@pytest.fixture(scope="session")
def single_run(tmp_path_factory):
    """(data, checkpoint): predict_run's model trained 2 epochs on the toy task's single sentences, a classifier of
    one text per input. Trained once for serve_helpers.single_folder (test_serve_clients.py, test_serve_hey.py,
    test_serve_shutdown.py), which only read it."""
    return prebuilt.get("single_run", tmp_path_factory)


@pytest.fixture(scope="session")
def plugin_task_run(tmp_path_factory):
    """(data, run folder): a tiny roberta trained one epoch under the plugin task sentence_prediction_acl on the
    toy data. Trained once for test_data_dictionary.py and test_acceleration.py, which only read it (each copies
    what it changes)."""
    return prebuilt.get("plugin_task_run", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_bert_rte(tmp_path_factory):
    """tiny_hf.bert_on_toy_rte's converted BERT, toy RTE folder and two-update run, built once for
    test_predict.py (which only reads it) and test_export.py (which changes a copy)."""
    return prebuilt.get("tiny_bert_rte", tmp_path_factory)


@pytest.fixture(scope="session")
def tiny_bert_mean(tmp_path_factory):
    """tiny_bert_rte with a two-class head made at conversion and mean pooling, for test_onnx.py (which only
    reads it)."""
    return prebuilt.get("tiny_bert_mean", tmp_path_factory)


@pytest.fixture(scope="session")
def predict_model(predict_run):
    """predict_run's checkpoint through the hub interface, in eval mode."""
    from acl_fairseq.inference import hub

    root, data, _ = predict_run
    return hub.from_pretrained(str(root / "ckpt"), "checkpoint_best.pt", data).eval()


@pytest.fixture(scope="session")
def predict_onnx(predict_run, tmp_path_factory):
    """predict_run's checkpoint through ``acl-export --format onnx`` (fp32): the folder that
    test_tokenization_parity.py, test_text_byte_budget.py and test_manifest_checks.py only read (or copy before
    changing). Exported once: each export took 5-10 s of make test."""
    from acl_fairseq.hf import export

    _, data, ckpt = predict_run
    out = tmp_path_factory.mktemp("predict_onnx") / "out"
    export.main([ckpt, "--data", data, "--output", str(out), "--format", "onnx"])
    return str(out / "onnx")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip that helpers.skip_is_failure_here rules out (the real GLUE data missing under CI=true) is
    reported as a failure, whichever file's skipif or pytest.skip raised it."""
    import helpers

    report = yield
    if report.skipped and not hasattr(report, "wasxfail") and isinstance(report.longrepr, tuple):
        reason = report.longrepr[2].removeprefix("Skipped: ")
        if helpers.skip_is_failure_here(reason):
            report.outcome = "failed"
            report.longrepr = (f"{item.nodeid}: skipped for '{reason}', but CI=true: .ci/run sets it up, so it "
                               "must be there in CI")
    return report


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """A tool's main() run in-process binds the root logger to that test's captured stderr (console.setup_logging,
    force=True); once the test ends that stream is closed, and the next test's first log line fails with
    'I/O operation on closed file'. Every test gets the root logger back as it found it."""
    import logging

    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = saved
