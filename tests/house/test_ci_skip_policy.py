"""Under CI=true a missing real GLUE folder fails the slow tests that read it instead of skipping them
(helpers.skip_is_failure_here, applied by conftest.py to every test's report)."""
import os
import subprocess
import sys

import pytest

import helpers
import test_preprocess
import test_tokenization

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/: its conftest.py and helpers


@pytest.mark.parametrize("ci,fails", [("true", True), ("TRUE", True), ("1", True), ("", False), ("false", False),
                                      (None, False)])
def test_only_ci_turns_the_missing_glue_skip_into_a_failure(ci, fails):
    environ = {} if ci is None else {"CI": ci}
    assert helpers.skip_is_failure_here(helpers.NO_REAL_GLUE, environ) is fails
    assert not helpers.skip_is_failure_here("could not import 'onnx'", environ)


def test_the_real_glue_tests_skip_with_the_reason_the_rule_knows():
    """The rule matches the reason text, so a reworded reason would quietly skip in CI again."""
    reasons = [m.kwargs.get("reason") for mod in (test_preprocess, test_tokenization) for fn in vars(mod).values()
               for m in getattr(fn, "pytestmark", []) if m.name == "skipif" and "GLUE" in str(m.kwargs)]
    assert len(reasons) == 2 and set(reasons) == {helpers.NO_REAL_GLUE}


@pytest.mark.slow  # make test's 10 minutes: a pytest run inside the test: about 7 s
def test_a_pytest_run_under_ci_reports_the_skip_as_a_failure(tmp_path):
    (tmp_path / "test_needs_glue.py").write_text(
        "import pytest\n\n\n"
        f"@pytest.mark.skipif(True, reason={helpers.NO_REAL_GLUE!r})\ndef test_glue():\n    pass\n\n\n"
        "def test_glue_inside():\n"
        f"    pytest.skip({helpers.NO_REAL_GLUE!r})\n\n\n"
        "@pytest.mark.skipif(True, reason='another reason')\ndef test_other():\n    pass\n"
    )
    summaries = {}
    for ci in ("true", ""):
        # tests/conftest.py as a plugin: tmp_path is outside tests/, where pytest would not find it
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-rfs",
                               str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                              env=dict(os.environ, CI=ci, PYTHONPATH=HERE))
        summaries[ci] = proc
    assert summaries["true"].returncode == 1, summaries["true"].stdout
    # the skipif fires in set-up, which pytest counts as an error; pytest.skip in the body, as a failure
    assert "1 failed, 1 skipped, 1 error" in summaries["true"].stdout
    assert "must be there in CI" in summaries["true"].stdout
    assert summaries[""].returncode == 0 and "3 skipped" in summaries[""].stdout, summaries[""].stdout


def test_every_skip_for_what_ci_sets_up_is_a_failure_under_ci(tmp_path):
    """qemu-user, PostgreSQL, the packaged MiniLM (helpers.skip_needed / import_needed) fail under CI like the GLUE
    files do; a skip that cannot apply on any machine CI runs on (root and a read-only folder) stays a skip."""
    (tmp_path / "test_needs.py").write_text(
        "import helpers\n\n\n"
        "def test_qemu():\n    helpers.skip_needed('qemu-x86_64', 'apt-get install qemu-user')\n\n\n"
        "def test_module():\n    helpers.import_needed('no_such_module_here', 'pip install it')\n\n\n"
        "def test_root():\n    import pytest\n    pytest.skip('no folder here refuses writes')\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-rfs",
                           str(tmp_path)], capture_output=True, text=True, cwd=tmp_path,
                          env=dict(os.environ, CI="true", PYTHONPATH=HERE))
    assert "2 failed, 1 skipped" in proc.stdout, proc.stdout[-3000:]


def test_the_tune_tests_are_collected_and_not_skipped_when_optuna_is_pinned():
    """A module-level importorskip('optuna') hid every tune test, under CI too: optuna is imported plainly."""
    import test_tune

    assert test_tune.optuna.__version__
