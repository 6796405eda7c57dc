"""The packages' boundaries: :mod:`acl_runtime` (serving, torch-free) never imports the plugin, torch or fairseq;
:mod:`acl_torch` (the maths both trainers call) imports neither trainer, fairseq nor transformers; the fairseq plugin
and the Hugging Face path (:mod:`acl_hf`) sit side by side and never import each other; and ``import acl_fairseq``
registers with fairseq whatever the command line says."""
import ast
import os
import pathlib
import subprocess
import sys

import helpers

RUNTIME = pathlib.Path(helpers.REPO) / "acl_runtime"
TRAINING_STACK = ("torch", "fairseq", "fairseq_cli", "acl_fairseq")


def imported_names(path: pathlib.Path):
    """Every module an ``import`` or ``from ... import`` in ``path`` names, at any depth (function bodies too), and
    every string given to ``importlib.import_module`` / ``__import__``."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant):
            yield node.args[0].value


def test_the_runtime_imports_neither_the_plugin_nor_torch_nor_fairseq():
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) >= 15, files
    bad = [(str(f.relative_to(RUNTIME)), name) for f in files for name in imported_names(f)
           if name.split(".")[0] in TRAINING_STACK]
    assert not bad, bad


# package -> the top-level names it must not import, at any depth (docs/architecture.md)
LAYERS = {
    "acl_torch": ("fairseq", "fairseq_cli", "transformers", "acl_fairseq", "acl_hf"),
    "acl_hf": ("fairseq", "fairseq_cli", "acl_fairseq"),
    "acl_fairseq": ("acl_hf",),
}


def test_the_torch_maths_and_the_two_trainers_keep_their_layers():
    bad = []
    for package, banned in LAYERS.items():
        files = sorted((pathlib.Path(helpers.REPO) / package).rglob("*.py"))
        assert len(files) >= 5, (package, files)
        bad += [(str(f.relative_to(helpers.REPO)), name) for f in files for name in imported_names(f)
                if name.split(".")[0] in banned]
    assert not bad, bad


def test_the_walk_sees_a_nested_import(tmp_path):
    """The check above can fail: a function-level import is found."""
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from acl_fairseq.inference import hub\n    import importlib\n"
                 "    importlib.import_module('torch')\n")
    assert list(imported_names(f)) == ["acl_fairseq.inference", "importlib", "torch"]


def test_importing_the_plugin_registers_whatever_the_command_line(tmp_path):
    """``import acl_fairseq`` once looked at sys.argv (acl-serve, or acl-predict on a folder with a manifest.json)
    and then registered nothing; fairseq's registries now get the criteria and the model under any command. A
    fresh interpreter per command, the three at once (4 s each to import torch and fairseq)."""
    (tmp_path / "manifest.json").write_text("{}")
    procs = {}
    for argv0 in ("acl-serve", "acl-predict", "fairseq-train"):
        code = (f"import sys\nsys.argv = [{argv0!r}, {str(tmp_path)!r}]\nimport acl_fairseq\n"
                "from fairseq.criterions import CRITERION_REGISTRY\nfrom fairseq.models import ARCH_MODEL_REGISTRY\n"
                "print('acl_embed' in CRITERION_REGISTRY, 'multi_exit_roberta' in ARCH_MODEL_REGISTRY)\n")
        procs[argv0] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=helpers.REPO,
                                        env=dict(os.environ, PYTHONPATH=helpers.REPO, OMP_NUM_THREADS="1"))
    for argv0, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (argv0, err[-2000:])
        assert out.split() == ["True", "True"], (argv0, out)


def test_acl_predict_finds_the_checkpoint_reader_through_its_entry_point():
    """The runtime reaches a fairseq checkpoint only through the entry point the training install declares."""
    from acl_runtime import predict

    reader = predict.checkpoint_reader()
    assert reader.__name__ == "acl_fairseq.inference.checkpoint_reader"
    assert callable(reader.load) and callable(reader.check_readable)
