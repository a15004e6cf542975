"""The GPU suite's dry run (CPU, toy sizes) within a budget: every section either ran or is listed as skipped
with why, the table's cells are each measured or skipped, the JSON and markdown are written, and the time is
accounted for. Also the budget: a section that no longer fits is skipped, not started."""
from __future__ import annotations

import json
import os
import sys

import pytest

from benchmarks import gpu_suite

BUDGET_S = 45.0  # on an idle machine; stretched by its load (see ``budget_s``)


def budget_s() -> float:
    """``BUDGET_S`` times how many runnable processes share each core (at least 1): the test tier's child process
    (half the budget) imports torch, Ray and pytest, which takes that many times longer on a loaded machine."""
    return BUDGET_S * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    argv = sys.argv
    sys.argv = ["gpu_suite", "--dry-run", "--budget-s", str(budget_s()), "--out", str(out)]
    try:
        gpu_suite.main()
    finally:
        sys.argv = argv
    return out, json.loads((out / "gpu_suite_cpu_dry.json").read_text())


def test_the_dry_run_runs_each_section_or_says_why_not(dry_run):
    out, results = dry_run
    skipped = {s["what"]: s["why"] for s in results["skipped"]}
    tests = results["tests"]  # first in priority: always started
    assert tests["status"] == "ran" and tests["skipped"] == tests["tests"] > 0 and tests["failures"] == 0
    for section in ("profile", "table", "e2e"):
        assert section in results or skipped[section].startswith("budget")
    if "profile" in results:
        rows = results["profile"]
        assert [r["members"] for r in rows] == list(gpu_suite.DRY_SIZES.profile_members)
        assert all(r["aten_ops"] > 0 and r["host_syncs_dispatch"] == 0 for r in rows)
    if "table" in results:
        measured = {row["cell"] for row in results["table"]}
        for cell in gpu_suite.table_cells(gpu_suite.DRY_SIZES):
            assert cell.name() in measured or cell.name() in skipped
        assert all(row["model_samples_per_s"] > 0 for row in results["table"] if "error" not in row)
    markdown = (out / "gpu_suite_cpu_dry.md").read_text()
    assert "(a) GPU test tier" in markdown and "Where the time went" in markdown
    seconds = results["seconds"]
    assert sum(v for k, v in seconds.items() if k != "total" and isinstance(v, float)) <= seconds["total"] + 1e-6


def test_a_section_that_no_longer_fits_is_skipped(monkeypatch):
    monkeypatch.setattr(gpu_suite, "run_tests", lambda budget: {"status": "ran"})
    args = gpu_suite.argparse.Namespace(dry_run=True, device="cpu", budget_s=0.0, sections=list(gpu_suite.SECTIONS))
    results = gpu_suite.run_suite(args)
    assert {s["what"] for s in results["skipped"]} == set(gpu_suite.SECTIONS)
    assert not set(gpu_suite.SECTIONS) & set(results)
