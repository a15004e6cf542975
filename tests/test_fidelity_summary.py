"""The fidelity benchmark's per-scale agreement and its summary over seeds, on hand-made results."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks.fidelity_summary import DEFAULT_VARIANT, rows_table, runs_of, summarize, summary_table
from benchmarks.transfer_fidelity import WORKLOADS, scale_agreement

SPEC = {name: WORKLOADS[name].make(True)[0] for name in ("resmlp", "lm")}


def test_scale_agreement_ranks_stocks_best_in_the_metrics_direction():
    full = {"a": 0.9, "b": 0.8, "c": 0.7, "d": 0.6}
    by_scale = {"8": {"a": 0.1, "b": 0.4, "c": 0.3, "d": 0.2}, "2": {"a": 0.5, "b": 0.4, "c": 0.3, "d": 0.2}}
    agreement = scale_agreement(SPEC["resmlp"], by_scale, full, "a")
    assert agreement["2"] == {"rho": pytest.approx(1.0), "best_rank": 1}
    assert agreement["8"]["best_rank"] == 4  # the worst accuracy at S=8
    assert agreement["8"]["rho"] == pytest.approx(-0.2)
    loss = scale_agreement(SPEC["lm"], {"4": {"a": 2.0, "b": 3.0}}, {"a": 1.0, "b": 1.5}, "a")  # lower is better
    assert loss["4"] == {"rho": pytest.approx(1.0), "best_rank": 1}


def _result(seed: int, expected: float, literal: float, speedup: float, rho8: float, escalated: bool) -> dict:
    run = {"expected_shortfall": expected, "expected_shortfall_se": 0.004, "shortfall": literal, "speedup": speedup,
           "escalation": "why" if escalated else None, "fallback": []}
    return {"seed": seed, "workloads": {"resmlp": {
        "kind": "residual MLP", "mode": "max",
        "stock": {"seconds": 20.0, "by_scale_vs_full": {"8": {"rho": rho8, "best_rank": 3},
                                                         "2": {"rho": 0.9, "best_rank": 1}}},
        "runs": {DEFAULT_VARIANT: run}}}}


def test_summary_counts_runs_within_the_goal_and_names_the_misses(tmp_path):
    results = [_result(0, 0.0, 0.012, 7.0, 0.1, True), _result(1, 0.0136, 0.02, 2.0, 0.3, False),
               _result(2, -0.004, 0.005, 3.0, math.nan, False)]
    for r in results:
        (tmp_path / f"transfer_fidelity_{r['seed']}.json").write_text(json.dumps(r))
    runs = runs_of([tmp_path])
    assert [r["seed"] for r in runs] == [0, 1, 2]
    s = summarize(runs, DEFAULT_VARIANT)["resmlp"]
    assert (s["runs"], s["expected_within"], s["literal_within"]) == (3, 2, 1)
    assert s["expected_misses"] == {1: 0.0136}
    assert s["median_expected"] == 0.0 and s["median_literal"] == 0.012
    assert s["speedup"] == [2.0, 7.0] and (s["escalated"], s["fallback"]) == (1, 0)
    assert s["spearman_by_scale"] == {"8": pytest.approx(0.2), "2": pytest.approx(0.9)}  # NaN left out
    table = summary_table({DEFAULT_VARIANT: summarize(runs, DEFAULT_VARIANT)})
    assert "| resmlp | " in table and "2 (seed 1: +1.36)" in table and "2.0–7.0×" in table
    rows = rows_table(runs, [DEFAULT_VARIANT, "S=4"]).splitlines()
    assert rows[2] == "| resmlp, 0 | 20 | +1.20 / 0.00 ± 0.40 (7.0×) E | — |"
    assert summarize(runs, "S=4") == {}  # a variant no run has
    assert s["speedup_vs_asha"] is None and "| — |" in table  # runs recorded before the figure


def test_summary_gives_the_speed_up_against_stock_with_asha_where_the_runs_have_it(tmp_path):
    results = [_result(seed, 0.0, 0.0, 4.0, 0.5, False) for seed in range(3)]
    for r, against_asha in zip(results, (0.6, 1.5, 0.9)):
        r["workloads"]["resmlp"]["runs"][DEFAULT_VARIANT]["speedup_vs_asha"] = against_asha
        (tmp_path / f"transfer_fidelity_{r['seed']}.json").write_text(json.dumps(r))
    summary = summarize(runs_of([tmp_path]), DEFAULT_VARIANT)
    assert summary["resmlp"]["speedup_vs_asha"] == [0.6, 0.9, 1.5]  # lowest, median, highest
    assert "| 0.60–1.50× (0.90×) |" in summary_table({DEFAULT_VARIANT: summary})


def test_summary_refuses_a_folder_without_results(tmp_path):
    with pytest.raises(SystemExit, match="no transfer_fidelity"):
        runs_of([tmp_path])


def test_summary_refuses_a_run_given_twice(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "transfer_fidelity.json").write_text(json.dumps(_result(3, 0.0, 0.0, 2.0, 0.5, False)))
    with pytest.raises(SystemExit, match="resmlp seed 3 is in both"):
        runs_of([tmp_path / "a", tmp_path / "b"])
