"""The serving install (pip install .[serve]): its pins are the project's, and CI builds it fresh
(scripts/check_serving_env.sh, which runs acl-predict OUT/onnx where torch and fairseq are absent)."""
import ast
import os
import re
import shutil
import subprocess
import sys

import helpers


def _serve_requires():
    tree = ast.parse(open(os.path.join(helpers.REPO, "setup.py")).read())
    return next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "SERVE_REQUIRES" for t in n.targets))


def test_the_serve_extra_pins_what_the_full_environment_pins():
    """The runtime and acl-serve's web stack as requirements.txt, numpy as scripts/setup_env.sh (fairseq's numpy 1)."""
    pins = dict(p.split("==") for p in _serve_requires())
    served = {"onnxruntime", "tokenizers", "starlette", "uvicorn", "prometheus-client", "msgspec"}
    assert set(pins) == {"numpy"} | served
    requirements = open(os.path.join(helpers.REPO, "requirements.txt")).read()
    for name in sorted(served):
        assert re.search(rf"^{name}=={re.escape(pins[name])}$", requirements, re.M), name
    setup_env = open(os.path.join(helpers.REPO, "scripts", "setup_env.sh")).read()
    assert f"numpy=={pins['numpy']}" in re.search(r'^BUILD_SPECS="([^"]*)"', setup_env, re.M).group(1)


def test_ci_builds_the_serving_environment_before_the_slow_tests():
    steps = [line.split("#")[0].strip() for line in open(os.path.join(helpers.REPO, ".ci", "run"))]
    steps = [s for s in steps if s]
    assert "bash scripts/check_serving_env.sh" in steps
    assert steps.index("bash scripts/check_serving_env.sh") < steps.index("make test-slow")


def test_the_wheel_carries_the_task_table(tmp_path):
    """acl-predict --task and acl-evaluate read the task rows from the package (acl_runtime/glue_tasks.tsv, which
    recipes/glue/hparams.tsv links to): a wheel must hold the table."""
    import zipfile

    build = tmp_path / "src"
    skip = shutil.ignore_patterns(".git", ".venv", "runs", "demo_out", "mutants", "build", "*.egg-info", "__pycache__")
    shutil.copytree(helpers.REPO, build, ignore=skip, symlinks=True)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(build),
                           "-w", str(tmp_path / "wheel")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    with zipfile.ZipFile(wheel) as z:
        text = z.read("acl_runtime/glue_tasks.tsv").decode()
    with open(os.path.join(helpers.REPO, "recipes", "glue", "hparams.tsv"), encoding="utf-8") as f:
        assert text == f.read()
