"""Transfer fidelity over many seeds: a summary table from ``benchmarks/transfer_fidelity.py``'s JSON files.

Per workload and variant: on how many runs the returned configuration is within 1 point (1% of the loss) of
stock's best in expectation (both configurations trained as Hydro's full-size target over the same seeds) and
as the benchmark's literal comparison (the target's one training against the best of stock's runs), the median
of each (a mean is one outlier's: stock's best run can be a configuration that collapses on other seeds), the
speed-ups (CPU time; against stock without early stopping, and against stock + ASHA where the JSON has it), how
many runs escalated or trained fallback targets, and, where the JSON has them, each surrogate scale's mean
Spearman against stock's full-size ranking of all configurations. Then one row per run
(``--rows``): literal / expected ± its standard error (speed-up), E escalated, F fallback targets.
Prints markdown; writes the summary as JSON to ``--out``.

    python -m benchmarks.fidelity_summary DIR_OR_JSON... [--variants "S=8 ladder+escalate-probe+fallback-2"]
                                          [--rows] [--out benchmarks/results/fidelity_summary.json]
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from benchmarks.transfer_fidelity import VARIANTS, WORKLOADS
from schedulers.transfer import Score

DEFAULT_VARIANT = "S=8 ladder+escalate-probe+fallback-2"  # TransferPolicy's defaults, rungs whole (as recorded)
GOAL = 0.01  # the issue's: within 1 point of accuracy, or 1% of the loss


def runs_of(paths: list[Path]) -> list[dict]:
    """Every (workload, seed) result in the JSON files at ``paths`` (a folder: its ``transfer_fidelity*.json``),
    each with its ``workload`` and ``seed``, sorted by workload then seed."""
    files = [f for p in paths for f in (sorted(p.glob("transfer_fidelity*.json")) if p.is_dir() else [p])]
    if not files:
        raise SystemExit(f"fidelity_summary: no transfer_fidelity*.json in {[str(p) for p in paths]}")
    runs, seen = [], {}
    for f in files:
        result = json.loads(f.read_text())
        for name, res in result["workloads"].items():
            key = (name, result["seed"])
            if key in seen:  # counted twice, it would weigh twice
                raise SystemExit(f"fidelity_summary: {name} seed {key[1]} is in both {seen[key]} and {f}; "
                                 f"pass each run once")
            seen[key] = f
            runs.append({**res, "workload": name, "seed": result["seed"]})
    order = list(WORKLOADS)
    return sorted(runs, key=lambda r: (order.index(r["workload"]), r["seed"]))


def summarize(runs: list[dict], variant: str) -> dict[str, dict]:
    """Per workload, ``variant``'s runs summarized (see the module docstring); workloads without it left out."""
    summary: dict[str, dict] = {}
    for name in dict.fromkeys(r["workload"] for r in runs):
        mine = [(r, r["runs"][variant]) for r in runs if r["workload"] == name and variant in r["runs"]]
        if not mine:
            continue
        expected = [run["expected_shortfall"] for _, run in mine]
        literal = [run["shortfall"] for _, run in mine]
        scales = {s for r, _ in mine for s in r["stock"].get("by_scale_vs_full", {})}
        summary[name] = {
            "kind": mine[0][0]["kind"], "mode": mine[0][0]["mode"], "runs": len(mine),
            "seeds": [r["seed"] for r, _ in mine],
            "expected_within": sum(e <= GOAL for e in expected),
            "expected_misses": {r["seed"]: e for (r, _), e in zip(mine, expected) if e > GOAL},
            "literal_within": sum(v <= GOAL for v in literal),
            "median_expected": statistics.median(expected), "median_literal": statistics.median(literal),
            "speedup": [min(run["speedup"] for _, run in mine), max(run["speedup"] for _, run in mine)],
            "speedup_vs_asha": _range([run["speedup_vs_asha"] for _, run in mine if "speedup_vs_asha" in run]),
            "escalated": sum(bool(run.get("escalation")) for _, run in mine),
            "fallback": sum(bool(run.get("fallback")) for _, run in mine),
            "spearman_by_scale": {s: _mean([r["stock"]["by_scale_vs_full"][s]["rho"] for r, _ in mine
                                            if s in r["stock"].get("by_scale_vs_full", {})])
                                  for s in sorted(scales, key=int, reverse=True)}}
    return summary


def _range(values: list[float]) -> list[float] | None:
    """``[lowest, median, highest]`` of ``values``; ``None`` if there is none (runs recorded before the figure)."""
    return [min(values), statistics.median(values), max(values)] if values else None


def _mean(values: list[float]) -> float:
    """The mean of the finite ``values`` (``Score.of`` leaves the others out); NaN if there is none."""
    score = Score.of(values)
    return math.nan if score is None else score.mean


def _points(value: float, loss: bool) -> str:
    """A shortfall in points of accuracy (or % of the loss), signed, with a typographic minus."""
    text = "0.00" if abs(value) < 5e-5 else f"{100 * value:+.2f}"
    return text.replace("-", "−") + ("%" if loss else "")


def summary_table(summaries: dict[str, dict[str, dict]]) -> str:
    lines = ["| workload | variant | runs | expected within 1 | literal within 1 | median expected | median literal | "
             "speed-up | vs stock + ASHA (median) | escalated / fallback | Spearman vs full by scale |",
             "|---" * 11 + "|"]
    for variant, summary in summaries.items():
        for name, s in summary.items():
            loss = s["mode"] == "min"
            misses = ", ".join(f"seed {seed}: {_points(e, loss)}" for seed, e in s["expected_misses"].items())
            scales = ", ".join(f"S={k} {v:.2f}" for k, v in s["spearman_by_scale"].items()) or "—"
            lines.append(f"| {name} | {variant} | {s['runs']} | {s['expected_within']}"
                         + (f" ({misses})" if misses else "") + f" | {s['literal_within']} | "
                         f"{_points(s['median_expected'], loss)} | {_points(s['median_literal'], loss)} | "
                         f"{s['speedup'][0]:.1f}–{s['speedup'][1]:.1f}× | {_speedups(s['speedup_vs_asha'])} | "
                         f"{s['escalated']} / {s['fallback']} | "
                         f"{scales} |")
    return "\n".join(lines)


def _speedups(spread: list[float] | None) -> str:
    return "—" if spread is None else f"{spread[0]:.2f}–{spread[2]:.2f}× ({spread[1]:.2f}×)"


def rows_table(runs: list[dict], variants: list[str]) -> str:
    """One row per run: each variant's literal / expected ± se (speed-up) E F; ``—`` where it did not run."""
    lines = ["| workload, seed | stock CPU s | " + " | ".join(variants) + " |", "|---|---|" + "---|" * len(variants)]
    for r in runs:
        loss = r["mode"] == "min"
        cells = []
        for variant in variants:
            run = r["runs"].get(variant)
            if run is None:
                cells.append("—")
                continue
            tags = ("E" if run.get("escalation") else "") + ("F" if run.get("fallback") else "")
            cells.append(f"{_points(run['shortfall'], loss)} / {_points(run['expected_shortfall'], loss)} ± "
                         f"{100 * run['expected_shortfall_se']:.2f} ({run['speedup']:.1f}×)"
                         + (f" {tags}" if tags else ""))
        lines.append(f"| {r['workload']}, {r['seed']} | {r['stock']['seconds']:.0f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+", type=Path, help="transfer_fidelity JSON files, or folders of them")
    parser.add_argument("--variants", default=DEFAULT_VARIANT, help="comma-separated; default: TransferPolicy's, rungs whole")
    parser.add_argument("--rows", action="store_true", help="also one row per run")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fidelity_summary.json"))
    args = parser.parse_args()
    variants = args.variants.split(",")
    if unknown := [v for v in variants if v not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    runs = runs_of(args.paths)
    summaries = {variant: summarize(runs, variant) for variant in variants}
    print(summary_table(summaries))
    if args.rows:
        print("\n" + rows_table(runs, variants))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summaries, indent=1))
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
