"""Tables, JSON and a figure for trace-driven energy simulations (all numbers are simulated)."""
from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from schedulers.energy.simulator import SimulationResult

_METRICS = ("cost_savings", "energy_savings", "time_savings", "regret_fraction")


def summarize(results: Sequence[SimulationResult]) -> list[dict]:
    """One row per (gpu, workload, policy): mean and std over seeds of savings vs the default and
    regret vs the oracle (fractions of their cumulative cost), and the usual final choice."""
    groups: dict[tuple[str, str, str], list[SimulationResult]] = defaultdict(list)
    for r in results:
        groups[(r.gpu, r.workload, r.policy)].append(r)
    rows = []
    for (gpu, workload, policy), runs in groups.items():
        row: dict = {"gpu": gpu, "workload": workload, "policy": policy, "seeds": len(runs)}
        for m in _METRICS:
            values = [r.totals[m] for r in runs]
            row[m] = float(np.mean(values))
            row[f"{m}_std"] = float(np.std(values))
        row["regret_j"] = float(np.mean([r.totals["regret"] for r in runs]))
        last = Counter((x.batch_size, x.power_limit_w) for r in runs for x in r.recurrences[-10:])
        row["final_batch_size"], row["final_power_limit_w"] = last.most_common(1)[0][0]
        row["oracle_batch_size"] = runs[0].oracle_batch_size
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """Fixed-width table of :func:`summarize` rows; percentages are mean ± std over seeds."""
    header = (
        f"{'gpu':5} {'workload':13} {'policy':6} {'cost saved':>14} {'energy saved':>14} {'time saved':>14} "
        f"{'regret/oracle':>14} {'final b, W':>11} {'oracle b':>8}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        pct = [f"{100 * r[m]:6.1f}±{100 * r[m + '_std']:4.1f}%" for m in _METRICS]
        final = f"{r['final_batch_size']}, {r['final_power_limit_w']}"
        lines.append(f"{r['gpu']:5} {r['workload']:13} {r['policy']:6} {pct[0]:>14} {pct[1]:>14} {pct[2]:>14} "
                     f"{pct[3]:>14} {final:>11} {r['oracle_batch_size']:>8}")
    return "\n".join(lines)


def write_json(path: Path, config: dict, rows: Sequence[dict], results: Sequence[SimulationResult]) -> None:
    """Config, summary rows and every run (per-recurrence batch size, power limit, energy, time, cost)."""
    payload = {"simulated": True, "config": config, "summary": list(rows), "runs": [r.to_dict() for r in results]}
    path.write_text(json.dumps(payload, indent=1))


def plot_cumulative_cost(path: Path, results: Sequence[SimulationResult]) -> None:
    """Grid (GPU rows x workload columns) of mean cumulative cost (J) per recurrence for each policy,
    with the default (b0 at maximum power) and the oracle arm as references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = sorted({r.gpu for r in results}, reverse=True)
    workloads = list(dict.fromkeys(r.workload for r in results))
    fig, axes = plt.subplots(len(gpus), len(workloads), figsize=(3.2 * len(workloads), 2.8 * len(gpus)), squeeze=False)
    for i, gpu in enumerate(gpus):
        for j, workload in enumerate(workloads):
            ax = axes[i][j]
            runs = [r for r in results if r.gpu == gpu and r.workload == workload]
            n = len(runs[0].recurrences)
            x = np.arange(1, n + 1)
            for policy in dict.fromkeys(r.policy for r in runs):
                curves = [np.cumsum([c.cost for c in r.recurrences]) for r in runs if r.policy == policy]
                ax.plot(x, np.mean(curves, axis=0), label=policy)
            ax.plot(x, x * runs[0].default_cost / n, "k--", label="default")
            ax.plot(x, x * runs[0].oracle_cost / n, "k:", label="oracle")
            ax.set_title(f"{gpu.upper()} {workload}", fontsize=9)
            ax.tick_params(labelsize=7)
            if i == len(gpus) - 1:
                ax.set_xlabel("recurrence", fontsize=8)
            if j == 0:
                ax.set_ylabel("cumulative cost (J)", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Simulated on the Zeus traces: cumulative cost per recurrence (mean over seeds)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
