"""The packages' layers, read from every import statement (function-level ones too): commands (``acl_fairseq.cli``)
sit on top and nothing below imports them, and no two modules import each other, directly or round a circle."""
import ast
import pathlib

import helpers

PACKAGES = ("acl_fairseq", "acl_runtime", "acl_torch", "acl_hf")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(helpers.REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: pathlib.Path, name: str):
    """The project modules ``path`` imports (``from pkg import mod`` names ``pkg.mod`` when that is a module)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{a.name}" for a in node.names)


def graph():
    files = {module_name(p): p for pkg in PACKAGES for p in pathlib.Path(helpers.REPO, pkg).rglob("*.py")}
    edges = {}
    for name, path in files.items():
        edges[name] = sorted({m for m in imports_of(path, name) if m in files and m != name
                              and not name.startswith(m + ".")})  # a module's own package's __init__ is no edge
    return edges


def test_no_module_below_the_commands_imports_them():
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if b.startswith("acl_fairseq.cli") and not a.startswith("acl_fairseq.cli")]
    assert not bad, bad


def cycles(edges):
    """One circle per strongly connected component of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    edges = graph()
    assert len(edges) > 60
    assert cycles(edges) == []


def test_the_circle_finder_finds_one():
    assert cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


def test_cli_holds_commands_and_their_helpers_only():
    """Each module of acl_fairseq/cli/ is a console script's or imported by one there only (the tuner's internals,
    the report tables and plots, the run plan live elsewhere)."""
    from importlib.metadata import entry_points

    commands = {e.value.split(":")[0] for e in entry_points(group="console_scripts")}
    edges = graph()
    cli = sorted(m for m in edges if m.startswith("acl_fairseq.cli.") and m != "acl_fairseq.cli")
    helpers_of = {m for c in commands for m in edges.get(c, ()) if m.startswith("acl_fairseq.cli.")}
    helpers_of |= {m for h in list(helpers_of) for m in edges.get(h, ()) if m.startswith("acl_fairseq.cli.")}
    assert set(cli) <= commands | helpers_of, sorted(set(cli) - commands - helpers_of)
    assert len(cli) <= 6, cli


def test_no_benchmark_entry_script_imports_another():
    """benchmarks/*.py each measure one thing; what they share lives in the harness modules (``_*.py``, common.py)."""
    folder = pathlib.Path(helpers.REPO, "benchmarks")
    entries = {p.stem for p in folder.glob("*.py") if not p.stem.startswith("_") and p.stem != "common"}
    assert len(entries) >= 15
    bad = [(p.stem, m) for p in folder.glob("*.py") for m in imports_of(p, p.stem) if m in entries]
    assert not bad, bad


def test_the_results_tables_and_the_run_record_import_no_torch():
    """The results tables' mean over seeds and the CPU-kind record live in acl_torch's standard-library modules
    (glue_metrics, machine), beside their users, not in the serving runtime: recipes/collect_results.py still
    imports neither torch nor fairseq, and the runner's result step runs under ``python -S`` (no site packages)."""
    import os
    import subprocess
    import sys

    path = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/recipes']; "
            "from acl_torch import glue_metrics, machine")
    loaded = "; print(sorted(m for m in ('torch', 'fairseq', 'numpy') if m in sys.modules))"
    collector = "; import collect_results; assert collect_results.mean_std is glue_metrics.mean_std"
    record = "; from acl_fairseq.runs import result; assert result.read_cpu_kind is machine.read_cpu_kind"
    for flags, code in (([], path + collector + loaded), (["-S"], path + record + collector + loaded)):
        proc = subprocess.run([sys.executable, *flags, "-c", code, helpers.REPO], capture_output=True, text=True,
                              env=dict(os.environ, PYTHONPATH=helpers.REPO), cwd=helpers.REPO)
        assert proc.returncode == 0 and proc.stdout.strip() == "[]", (flags, proc.stdout, proc.stderr[-2000:])
