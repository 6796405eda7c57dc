"""scripts/setup_env.sh's pip wrapper: pip's report of fairseq-fixed's torchaudio requirement (left out on purpose)
becomes one line saying so, and nothing else pip says is hidden. Run on pip's own wording with a stand-in pip."""
import os
import subprocess

import helpers

SCRIPT = os.path.join(helpers.REPO, "scripts", "setup_env.sh")
HEADER = ("ERROR: pip's dependency resolver does not currently take into account all the packages that are "
          "installed. This behaviour is the source of the following dependency conflicts.")
TORCHAUDIO = "fairseq-fixed 0.12.3.1 requires torchaudio>=0.8.0, which is not installed."
OTHER = "optuna 5.1.0 requires sqlalchemy>=1.4.2, which is not installed."


def _pip_install(stderr: str, status: int = 0):
    """setup_env.sh's pip_install with a pip that writes ``stderr`` and exits ``status``: (stdout, stderr, rc)."""
    function = subprocess.run(["sed", "-n", "/^TORCHAUDIO_LINE=/,/^}/p", SCRIPT], capture_output=True, text=True,
                              check=True).stdout
    assert "pip_install()" in function
    code = (f"set -euo pipefail\nPIP=(bash -c 'printf %s \"$PIP_ERR\" >&2; exit {status}' pip)\n{function}\n"
            "pip_install -r requirements.txt")
    proc = subprocess.run(["bash", "-c", code], capture_output=True, text=True, env={**os.environ, "PIP_ERR": stderr})
    return proc.stdout, proc.stderr, proc.returncode


def test_the_known_torchaudio_report_is_one_line_saying_why_and_no_error():
    out, err, rc = _pip_install(f"{HEADER}\n{TORCHAUDIO}\n")
    assert rc == 0 and err == "" and "ERROR" not in out
    assert out.count("\n") == 1 and "torchaudio, left out on purpose" in out


def test_another_conflict_is_still_reported_with_pips_header():
    out, err, rc = _pip_install(f"{HEADER}\n{TORCHAUDIO}\n{OTHER}\n")
    assert rc == 0 and err.splitlines() == [HEADER, OTHER] and "left out on purpose" in out


def test_other_output_and_a_failure_pass_through():
    out, err, rc = _pip_install("ERROR: No matching distribution found for nothing==1\n", status=1)
    assert rc == 1 and out == "" and err == "ERROR: No matching distribution found for nothing==1\n"
