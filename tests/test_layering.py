"""The three layers, one rule each: ``schedulers/`` imports neither Ray nor torch nor ``hydro``, ``hydro/`` imports Ray
only in ``hydro/tune`` (the one Ray integration package), and importing the core does not load Ray. No two modules
of ``hydro`` and ``schedulers`` import each other, directly or through others (imports inside functions count; those
under ``if TYPE_CHECKING:``, for annotations only, never run)."""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def _runtime_nodes(tree: ast.AST):
    """The nodes of ``tree`` outside ``if TYPE_CHECKING:`` blocks (imports there are for annotations only)."""
    work = [tree]
    while work:
        node = work.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                work.extend(child.orelse)
            else:
                work.append(child)


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Each module of ``hydro`` and ``schedulers`` -> the modules of theirs it imports anywhere in its file
    (``from package import module`` counts as importing ``module``; relative imports resolved)."""
    paths = {_module_name(p): p for folder in ("hydro", "schedulers") for p in _python_files(folder)}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                targets.update(known(f"{base}.{alias.name}") or known(base) for alias in node.names)
        graph[module] = targets - {None, module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(component)
            elif target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                on_stack.add(target)
                work.append((target, iter(sorted(graph[target]))))
            elif target in on_stack:
                low[node] = min(low[node], index[target])
    return found


def _python_files(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    return files


@pytest.mark.parametrize("forbidden", ["ray", "torch"])
def test_schedulers_import_neither_ray_nor_torch(forbidden):
    offenders = [str(p.relative_to(ROOT)) for p in _python_files("schedulers") if forbidden in _imported_roots(p)]
    assert not offenders, f"schedulers/ is plain Python; these import {forbidden}: {offenders}"


def test_schedulers_import_nothing_from_hydro():
    offenders = [str(p.relative_to(ROOT)) for p in _python_files("schedulers") if "hydro" in _imported_roots(p)]
    assert not offenders, f"schedulers/ decides, hydro/ runs: these import hydro: {offenders}"


def test_no_import_cycles():
    cycles = [sorted(c) for c in _cycles(_import_graph())]
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"


def test_the_cycle_finder_sees_cycles_through_function_level_and_relative_imports(tmp_path, monkeypatch):
    package = tmp_path / "hydro"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from . import b\n")
    (package / "b.py").write_text("def f():\n    from hydro.c import g\n")
    (package / "c.py").write_text("import hydro.a\n")
    (package / "d.py").write_text("import hydro.c\n")
    (package / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import hydro.d\n")
    (package / "f.py").write_text("import hydro.e\n")
    (tmp_path / "schedulers").mkdir()
    (tmp_path / "schedulers" / "__init__.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert _cycles(_import_graph()) == [{"hydro.a", "hydro.b", "hydro.c"}]
    (package / "d.py").write_text("import hydro.c\nimport hydro.f\n")  # d -> f -> e -> d for annotations only
    assert _cycles(_import_graph()) == [{"hydro.a", "hydro.b", "hydro.c"}]


def test_only_hydro_tune_imports_ray():
    offenders = [str(p.relative_to(ROOT)) for p in _python_files("hydro")
                 if "ray" in _imported_roots(p) and p.relative_to(ROOT).parts[:2] != ("hydro", "tune")]
    assert not offenders, f"Ray belongs in hydro/tune only; these import it: {offenders}"


def test_the_scan_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ray import tune\n    import torch.nn as nn\n")
    assert _imported_roots(probe) == {"ray", "torch"}


def test_importing_the_core_does_not_load_ray():
    modules = ["hydro", "hydro.trial", "hydro.bubbles", "hydro.energy", "hydro.shrink", "schedulers.member_stopping",
               "schedulers.energy"]
    code = f"import sys\nfor m in {modules!r}: __import__(m)\nprint('ray' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split()[0] == "False", "a core module pulled in Ray"
