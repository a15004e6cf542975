"""``hydro energy simulate``: the trace-driven recurring-job simulation, as a table, JSON and PNG."""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from hydro.cli_options import UsageError, at_least, checked
from hydro.energy.report import format_table, plot_cumulative_cost, summarize, write_json
from schedulers.energy.simulator import POLICIES, simulate_grid
from schedulers.energy.traces import WORKLOADS, TraceError, available_gpus, traces_dir


RESULTS_ROOT = Path("~/hydro_results")


def default_out_dir() -> Path:
    """Where a run writes without ``--out``: ``~/hydro_results/energy_simulate_<UTC time>``."""
    return RESULTS_ROOT.expanduser() / time.strftime("energy_simulate_%Y%m%d_%H%M%S", time.gmtime())


def add_subparser(sub: argparse._SubParsersAction) -> None:
    """Register ``hydro energy ...`` on the top-level sub-command set."""
    energy = sub.add_parser("energy", help="GPU energy: trace-driven simulation of the energy optimizers.")
    energy_sub = energy.add_subparsers(dest="energy_command", required=True)
    sim = energy_sub.add_parser("simulate", help="Recurring jobs on the Zeus traces: savings and regret per policy.")
    sim.add_argument("--gpus", nargs="+", default=["v100", "p100"], help="power traces to use (default: v100 p100)")
    sim.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS),
                     help="Zeus workloads (default: all)")
    sim.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES),
                     help="policies compared (default: all)")
    sim.add_argument("--seeds", type=at_least(1), default=10, help="number of seeds, 0..N-1 (default: %(default)s)")
    sim.add_argument("--recurrences", type=at_least(1), default=50,
                     help="recurrences of each job (default: %(default)s)")
    sim.add_argument("--eta", type=checked(float, lambda v: 0 <= v <= 1, "in [0, 1]"), default=0.5,
                     help="energy weight of the cost, in [0, 1] (default: %(default)s)")
    sim.add_argument("--beta", type=checked(float, lambda v: v > 1, "> 1"), default=2.0,
                     help="early-stop bound factor, > 1 (default: %(default)s)")
    sim.add_argument("--traces", default=None,
                     help="Zeus trace directory (default: $HYDRO_ZEUS_TRACES, else <repo>/../shared/data/zeus-traces)")
    sim.add_argument("--out", type=Path, default=None,
                     help=f"output directory (default: a new {RESULTS_ROOT}/energy_simulate_<UTC time>)")
    sim.set_defaults(func=run_simulate)


def run_simulate(args: argparse.Namespace) -> int:
    """Simulate, print the summary table, write ``energy_simulation.json`` and ``energy_cumulative_cost.png``
    to ``--out`` (default: a new directory under ``~/hydro_results``)."""
    _check_gpus(args.gpus, args.traces)
    args.out = args.out or default_out_dir()
    results = simulate_grid(
        args.gpus, args.workloads, args.policies, range(args.seeds),
        recurrences=args.recurrences, eta=args.eta, beta=args.beta, traces_path=args.traces,
    )
    rows = summarize(results)
    print("Simulated on the Zeus traces (savings vs default b0 at max power; regret vs best fixed arm):")
    print(format_table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in vars(args).items() if k not in ("func", "out", "command", "energy_command")}
    write_json(args.out / "energy_simulation.json", config, rows, results)
    plot_cumulative_cost(args.out / "energy_cumulative_cost.png", results)
    print(f"wrote {args.out / 'energy_simulation.json'} and {args.out / 'energy_cumulative_cost.png'}")
    return 0


def _check_gpus(gpus: list[str], traces: str | None) -> None:
    """Refuse a trace directory that is missing, or GPUs it has no power trace of, before anything runs."""
    try:
        found = available_gpus(traces)
    except TraceError as error:
        raise UsageError(f"hydro energy simulate: {error}") from None
    missing = [gpu for gpu in gpus if gpu.lower() not in found]
    if missing:
        raise UsageError(f"hydro energy simulate: no power trace for --gpus {' '.join(missing)} in "
                         f"{traces_dir(traces)}; available: {' '.join(found)}")
