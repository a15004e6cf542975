"""The three layers, one rule each: ``schedulers/`` imports neither Ray nor torch, ``hydro/`` imports Ray only in
``hydro/tune`` (the one Ray integration package), and importing the core does not load Ray."""
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


def _python_files(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    return files


@pytest.mark.parametrize("forbidden", ["ray", "torch"])
def test_schedulers_import_neither_ray_nor_torch(forbidden):
    offenders = [str(p.relative_to(ROOT)) for p in _python_files("schedulers") if forbidden in _imported_roots(p)]
    assert not offenders, f"schedulers/ is plain Python; these import {forbidden}: {offenders}"


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
