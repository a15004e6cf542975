"""``hydro tune``: tune a bundled example or a user workload with Hydro on Ray Tune, print the member table
and the best configuration."""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time

import pandas as pd

from hydro.tune.examples import EXAMPLES
from hydro.tune.results import BEST_FILE, MEMBER_TABLE_FILE, best_configuration, member_table
from hydro.tune.run import asha, fit, optuna_tpe
from hydro.trial.spec import TuneSpec

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_subparser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tune", help="tune an example or your workload with Hydro on Ray Tune")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--example", choices=sorted(EXAMPLES), help="a bundled offline workload")
    what.add_argument("--workload", help="FILE.py[:FUNC] or MODULE[:FUNC]; FUNC (default 'workload') returns "
                                         "(TuneSpec, param_space)")
    parser.add_argument("--samples", type=int, default=16, help="member configurations to try")
    parser.add_argument("--scale", type=int, default=1, help="surrogate width divisor S (1: full size)")
    parser.add_argument("--fusion", default="auto", help="members per fused trial, or 'auto' (measured)")
    parser.add_argument("--scheduler", choices=["asha", "none"], default="asha", help="per-member early stopping")
    parser.add_argument("--searcher", choices=["random", "optuna"], default="random")
    parser.add_argument("--epochs", type=int, help="epochs per member (default: the workload's)")
    parser.add_argument("--transfer-fraction", type=float, default=1.0,
                        help="fraction of members finished before the full-size target trains")
    parser.add_argument("--address", help="Ray cluster address ('auto' or host:port); default: $RAY_ADDRESS "
                                          "(set inside 'ray job submit'), else an embedded local cluster")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0,
                        help="GPUs per trial (fractions below 1 share a card); trials train on the GPU Ray gives them")
    parser.add_argument("--storage", default=os.path.expanduser("~/hydro_results"), help="run directory root")
    parser.add_argument("--name", help="run name (default: generated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=run)


def load_workload(reference: str) -> tuple[TuneSpec, dict]:
    """``(spec, param_space)`` from ``path/file.py[:func]`` or ``module[:func]``."""
    target, _, func = reference.partition(":")
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise SystemExit(f"hydro tune: workload file {target!r} does not exist")
        name = f"hydro_workload_{os.path.basename(target)[:-3]}"
        spec = importlib.util.spec_from_file_location(name, target)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # Ray workers need not import the user's file
    factory = getattr(module, func or "workload", None)
    if factory is None:
        raise SystemExit(f"hydro tune: {target!r} defines no function {func or 'workload'!r} returning "
                         f"(TuneSpec, param_space)")
    result = factory()
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], TuneSpec)):
        raise SystemExit(f"hydro tune: {reference} must return (TuneSpec, param_space), got {type(result).__name__}")
    return result


def run(args: argparse.Namespace) -> int:
    import ray

    spec, space = EXAMPLES[args.example]() if args.example else load_workload(args.workload)
    if args.epochs:
        spec.epochs = args.epochs
    if args.address or os.environ.get("RAY_ADDRESS"):  # e.g. inside `ray job submit`: the job's cluster
        ray.init(address=args.address)
    elif not ray.is_initialized():  # an embedded local cluster whose workers import this checkout of Hydro
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": PACKAGE_ROOT}})
    fusion = args.fusion if args.fusion == "auto" else int(args.fusion)
    start = time.perf_counter()
    results, _ = fit(spec, space, num_samples=args.samples, scale=args.scale, fusion=fusion,
                     scheduler=asha(spec) if args.scheduler == "asha" else None,
                     searcher=optuna_tpe(args.seed) if args.searcher == "optuna" else None,
                     transfer_fraction=args.transfer_fraction, storage_path=args.storage, name=args.name,
                     seed=args.seed, gpus_per_trial=args.gpus_per_trial)
    elapsed = time.perf_counter() - start
    table = member_table(results, spec)
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", 80):
        print(f"\nHydro: {args.samples} members (scale {args.scale}, fusion {args.fusion}) in {elapsed:.0f} s\n")
        print(table.drop(columns=["error"]).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    best = best_configuration(results, spec)
    print(f"\nbest configuration ({best['kind']}, {spec.metric} = {best['value']:.4f}): {best['config']}")
    print(f"written: {os.path.join(results.experiment_path, MEMBER_TABLE_FILE)}, "
          f"{os.path.join(results.experiment_path, BEST_FILE)}")
    return 0
