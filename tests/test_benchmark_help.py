"""Every benchmark script answers ``--help`` (argparse formats help strings with %, so a "%" in a variant name
once made ``transfer_fidelity --help`` raise)."""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

SCRIPTS = sorted(p.stem for p in (Path(__file__).parent.parent / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_answers_help(script, monkeypatch, capsys):
    module = importlib.import_module(f"benchmarks.{script}")
    monkeypatch.setattr(sys, "argv", [script, "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")
