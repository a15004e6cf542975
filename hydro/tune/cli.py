"""``hydro tune``: tune a bundled example or a user workload with Hydro on Ray Tune, print the member table
and the best configuration."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import importlib.util
import logging
import os
import socket
import sys
import sysconfig
import time
import traceback

import pandas as pd

from hydro.cli_options import UsageError, at_least, checked
from hydro.tune.energy import options as energy_options
from hydro.tune.cluster import ray_internals
from hydro.tune.cluster.auth import token_refused
from hydro.tune.examples import EXAMPLES
from hydro.trial.check import describe
from hydro.trial.spec import TuneSpec
from hydro.trial.plan import TrialKind
from hydro.tune.cluster.output import ray_output
from hydro.tune.cluster.worker_env import PACKAGE_ROOT
from hydro.tune.search.results import BEST_FILE, MEMBER_TABLE_FILE, best_configuration, member_table
from hydro.tune.run import (TuningFailed, asha, check_arguments, check_run_dir, check_storage, fit,
                            optuna_tpe, prepare, resume, start_local_cluster)
from hydro.tune.placement.gpu_types import require_gpu_types
from hydro.tune.placement.trial_placement import PLACEMENTS, check_placement
from hydro.tune.search.trainable import require_resources, trial_resources
from schedulers.scale_choice import AUTO, checked_scale
from schedulers.transfer import STAGE_OPTIONS, Disagreement, TransferPolicy

logger = logging.getLogger(__name__)

TOP_ROWS = 10  # member rows printed (all of them are in the member table file)
STILL_TRAINING = "-"  # stop_epoch of a member that early stopping did not end
LEGEND = f"""
member: mNNNNN one sampled configuration, mNNNNN@S its re-training at scale S (the width ladder), #k a seed repeat;
  target: the returned configuration at full size (the first row; fallback targets: more configurations at full
  size, the best one returned). kind: surrogate (shrunk by --scale, fused), fused (full size, fused: --scale 1),
  target (full size), plain (full size, unfused). trial: the Ray trial (a fused group) that trained it. epochs:
  epochs it trained. stop_epoch: the epoch early stopping ended it at ({STILL_TRAINING}: it trained every epoch).
  A "group (64,)" in the log: members that may share fused trials, keyed by (batch size, TuneSpec.group_by values)."""


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """Shows an option's default where it has one (``None``/empty: the help says what applies)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default in (None, (), False):
            return action.help
        return super()._get_help_string(action)


def add_subparser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tune", help="tune an example or your workload with Hydro on Ray Tune",
                            formatter_class=DefaultsHelp)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--example", choices=sorted(EXAMPLES), help="a bundled offline workload")
    what.add_argument("--workload", help="FILE.py[:FUNC] or MODULE[:FUNC]; FUNC (default 'workload') returns "
                                         "(TuneSpec, param_space); modules beside FILE.py can be imported")
    parser.add_argument("--samples", type=at_least(1), default=16, help="member configurations to try")
    parser.add_argument("--scale", type=_auto_or_count("a width divisor"), default=1,
                        help="surrogate width divisor S (1: full size), or 'auto': the finest of 8, 4, 2 whose fused "
                             "step costs at most 2.5 times the S=8 one's (measured; S=8 checked by a pilot at S=4)")
    parser.add_argument("--fusion", type=_auto_or_count("a number of members"), default="auto",
                        help="members per fused trial, or 'auto' (measured)")
    parser.add_argument("--scheduler", choices=["asha", "none"], default="asha", help="per-member early stopping")
    parser.add_argument("--searcher", choices=["random", "optuna"], default="random")
    parser.add_argument("--epochs", type=at_least(1), help="epochs per member (default: the workload's)")
    parser.add_argument("--transfer-fraction", type=checked(float, lambda value: 0 < value <= 1, "in (0, 1]"),
                        default=1.0, help="fraction of members finished before the full-size target trains")
    parser.add_argument("--shrink-fixed", type=_names, default=(), metavar="PATH[,PATH...]",
                        help="module paths kept at full width when shrinking (e.g. a GRU: --shrink-fixed gru)")
    parser.add_argument("--min-width", type=at_least(1), help="smallest width a shrunk layer may have "
                                                                "(default: the workload's)")
    parser.add_argument("--strict-shrink", action="store_true",
                        help="refuse a layer the Shrinker cannot shrink instead of keeping it at full width")
    parser.add_argument("--address", help="Ray cluster address ('auto' or host:port); default: $RAY_ADDRESS "
                                          "(set inside 'ray job submit'), else an embedded local cluster "
                                          "listening on 127.0.0.1 only")
    parser.add_argument("--gpus-per-trial", type=float, default=0.0,
                        help="GPUs per trial: 1, or a fraction to share a card (a fused trial trains on one GPU); "
                             "trials train on the GPU Ray gives them, one trial slot per card")
    parser.add_argument("--storage", default=os.path.expanduser("~/hydro_results"), help="run directory root")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="go on with the interrupted run in RUN_DIR (<storage>/<name>) with the same --example or "
                             "--workload and trial options: its finished trials are kept, its lost ones retried")
    parser.add_argument("--max-failures", type=at_least(0), default=1,
                        help="retries of a trial whose worker, node or storage was lost: from its last checkpoint, "
                             "then as many fresh trials of its members")
    parser.add_argument("--no-target", action="store_true",
                        help="search only: no transfer stages and no full-size target; the best surrogate's "
                             "configuration is the answer (without it, a run that ends without its target exits 1)")
    parser.add_argument("--name", help="run name (default: generated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true",
                        help="also Ray's trial table and log lines, and every member row (default: Hydro's member "
                             f"progress and the top {TOP_ROWS} rows; all of them are in {MEMBER_TABLE_FILE})")
    _add_transfer_arguments(parser)
    energy_options.add_arguments(parser)
    parser.add_argument("--bubbles", action="store_true",
                        help="run the fused trials in the bubbles of the pipeline jobs registered with the cluster's "
                             "placement service (late-stage trials and the target on its dedicated workers); needs "
                             "--address or $RAY_ADDRESS; with --energy, the energy bandit picks the fills' batch "
                             "sizes (docs/energy.md#energy-or-trials-per-stage)")
    parser.add_argument("--placement", choices=PLACEMENTS,
                        help="elastic: run each fused trial on the GPU type (nodes declaring hydro_gpu:<type> "
                             "resources, or Ray's detected types) where it is predicted to finish first; with "
                             "--energy, of least predicted energy cost once each type has measured trials; with "
                             "--bubbles, only the full-size targets (docs/prediction-and-placement.md)")
    parser.set_defaults(func=run)


TRANSFER_OPTIONS = ("seeds", *STAGE_OPTIONS)  # the TransferPolicy fields the CLI sets


def _add_transfer_arguments(parser: argparse.ArgumentParser) -> None:
    """The transfer stages' options (:class:`~schedulers.transfer.TransferPolicy`), with its defaults."""
    default = {f.name: f.default for f in dataclasses.fields(TransferPolicy) if f.name in TRANSFER_OPTIONS}
    fraction = checked(float, lambda value: value >= 0, ">= 0")
    group = parser.add_argument_group("transfer stages (after the surrogates, with --scale > 1; "
                                      "docs/tuner-and-transfer.md#trustworthy-transfer)")
    group.add_argument("--ladder", action=argparse.BooleanOptionalAction, default=default["ladder"],
                       help="the width ladder: the best 1/eta again at S/2, S/4, ... before full size")
    group.add_argument("--eta", type=at_least(2), default=default["eta"], help="each ladder rung keeps the best 1/eta")
    group.add_argument("--halving", action=argparse.BooleanOptionalAction, default=default["halving"],
                       help="successive halving over epochs inside each ladder rung, down to what the next stage "
                            "trains (one seed); default: decided when the search ends, on where its members' ranking "
                            "at the rungs' milestone epochs is shown to agree with their final one")
    group.add_argument("--top-k", type=at_least(1), default=default["top_k"],
                       help="configurations trained at full size; the best on validation is returned")
    group.add_argument("--seeds", type=at_least(1), default=default["seeds"],
                       help="repeats of each configuration in the surrogate stages (scores: mean and spread)")
    group.add_argument("--escalate", action=argparse.BooleanOptionalAction, default=default["escalate"],
                       help="rank every configuration again at S/2 (S >= 8) when the first rung disagrees with the "
                            "search or the target does worse than its surrogate")
    group.add_argument("--disagreement", choices=[d.value for d in Disagreement],
                       default=default["disagreement"].value,
                       help="what makes the first rung disagree, and escalate: probe, a probe S/2 promotes or a rank "
                            "agreement confidently below --min-agreement; likely, one below it; confident, one "
                            "confidently below it")
    group.add_argument("--probes", type=at_least(0), default=default["probes"],
                       help="configurations from below the first rung's cut it trains too")
    group.add_argument("--probe-margin", type=fraction, default=default["probe_margin"],
                       help="a probe disagrees only when it leads the best configuration S/2 leaves out by more "
                            "than this fraction")
    group.add_argument("--max-target-drop", type=fraction, default=default["max_target_drop"],
                       help="a target worse than its finest surrogate by more than this fraction escalates, then "
                            "trains fallback targets (0.005: more accuracy, less speed)")
    group.add_argument("--fallback-targets", type=at_least(0), default=default["fallback_targets"],
                       help="configurations trained at full size when the target still does worse")
    group.add_argument("--min-agreement", type=checked(float, lambda value: -1 <= value <= 1, "in [-1, 1]"),
                       default=default["min_agreement"],
                       help="the Spearman rho the transfer check holds rank agreement to (a warning when "
                            "confidently below it)")


def transfer_options(args: argparse.Namespace) -> dict:
    """The ``transfer`` keywords of :func:`~hydro.tune.run.fit` that ``hydro tune``'s arguments set."""
    options = {name: getattr(args, name) for name in TRANSFER_OPTIONS}
    return {**options, "disagreement": Disagreement(options["disagreement"])}


def _auto_or_count(what: str):
    """An argparse type: 'auto', or an int >= 1 (``what`` names it in the error)."""
    def parse(text: str) -> int | str:
        if text == AUTO:
            return text
        try:
            return at_least(1)(text)
        except argparse.ArgumentTypeError as error:
            raise argparse.ArgumentTypeError(f"give 'auto' or {what} >= 1 ({error})") from None
    return parse


def _names(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def load_workload(reference: str) -> tuple[TuneSpec, dict]:
    """``(spec, param_space)`` from ``path/file.py[:func]`` or ``module[:func]``. The file's folder goes on
    ``sys.path`` (its modules import the modules beside it), and the modules it brings in from there are
    pickled by value, so Ray workers run them without that folder (a cluster, a ``ray job submit`` job)."""
    target, _, func = reference.partition(":")
    before = set(sys.modules)
    try:
        module, folder = _import_workload(target)
    except Exception as error:  # the user's module raised while importing, or is not there
        raise UsageError(f"hydro tune: --workload {reference}: importing {target!r} failed: "
                         f"{_where(error)}{describe(error)}") from None
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # Ray workers need not import the user's file
    for name in set(sys.modules) - before:  # ... nor the modules beside it
        path = getattr(sys.modules[name], "__file__", None) or ""
        if folder and "." not in name and os.path.abspath(path).startswith(folder + os.sep):
            cloudpickle.register_pickle_by_value(sys.modules[name])
    factory = getattr(module, func or "workload", None)
    if not callable(factory):
        raise UsageError(f"hydro tune: {target!r} defines no function {func or 'workload'!r} returning "
                         f"(TuneSpec, param_space)")
    try:
        result = factory()
    except Exception as error:
        raise UsageError(f"hydro tune: --workload {reference}: calling {func or 'workload'}() failed: "
                         f"{_where(error)}{describe(error)}") from None
    if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], TuneSpec)):
        raise UsageError(f"hydro tune: {reference} must return (TuneSpec, param_space), got {type(result).__name__}")
    return result


def _import_workload(target: str):
    """The module of a ``--workload`` target (a file or a module name) and the folder put on ``sys.path``."""
    if target.endswith(".py"):
        if not os.path.exists(target):
            raise UsageError(f"hydro tune: workload file {target!r} does not exist")
        folder = os.path.dirname(os.path.abspath(target))
        if folder not in sys.path:
            sys.path.insert(0, folder)
        name = f"hydro_workload_{os.path.basename(target)[:-3]}"
        spec = importlib.util.spec_from_file_location(name, target)
        module = sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module, folder
    return importlib.import_module(target), None


def _where(error: BaseException) -> str:
    """``file:line: `` of the innermost frame of ``error``'s traceback in the user's code (not Python's own
    library, not Hydro), or ``""`` when there is none (e.g. a module that is not there)."""
    own = (sysconfig.get_paths()["stdlib"], os.path.join(PACKAGE_ROOT, "hydro") + os.sep, "<")
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(own)]
    return f"{frames[-1].filename}:{frames[-1].lineno}: " if frames else ""


def run(args: argparse.Namespace) -> int:
    if args.bubbles and not (args.address or os.environ.get("RAY_ADDRESS")):
        raise UsageError("hydro tune --bubbles: give the cluster whose pipeline jobs have registered their bubbles "
                         "(--address or $RAY_ADDRESS); an embedded cluster has none")
    spec, space = EXAMPLES[args.example]() if args.example else load_workload(args.workload)
    shrink = {"shrink_fixed": args.shrink_fixed or spec.shrink_fixed, "shrink_strict": args.strict_shrink or
              spec.shrink_strict, "shrink_min_width": args.min_width or spec.shrink_min_width}
    try:
        spec = dataclasses.replace(spec, epochs=args.epochs or spec.epochs, **shrink)
    except ValueError as error:
        raise UsageError(f"hydro tune: {error}") from None
    job = args.name or args.example or os.path.basename(args.workload)
    energy = energy_options.settings_from_args(args, spec, job)
    start = time.perf_counter()
    try:  # before Ray starts
        check_arguments(spec, space, energy=energy, bubbles=args.bubbles, gpus_per_trial=args.gpus_per_trial)
        TransferPolicy(None if args.no_target else args.transfer_fraction, args.samples, spec.metric, spec.mode,
                       scale=checked_scale(args.scale), **transfer_options(args))  # refuses transfer options that
        if args.resume:                                                            # cannot act (e.g. at --scale 1)
            check_run_dir(args.resume)
        else:
            check_storage(args.storage)
        data = prepare(spec, space, scale=args.scale, seed=args.seed)
        check_placement(args.placement, spec, data, local_cluster=starts_local(args.address))
    except ValueError as error:  # a WorkloadError too
        raise UsageError(f"hydro tune: {error}") from None
    with ray_output(args.verbose):
        started = connect(args.address)
    if started and not args.bubbles:
        try:
            require_resources(trial_resources(spec, gpus_per_trial=args.gpus_per_trial), strict=True)
        except ValueError as error:
            raise UsageError(f"hydro tune: {error}") from None
    if args.placement is not None:
        try:
            require_gpu_types()
        except ValueError as error:
            raise UsageError(f"hydro tune: {error}") from None
    rows = None if args.verbose else TOP_ROWS
    try:
        if args.resume:
            results, searcher = resume(args.resume, spec, data=data, energy=energy, bubbles=args.bubbles,
                                       gpus_per_trial=args.gpus_per_trial,
                                       plan_fusion=args.fusion == AUTO and args.gpus_per_trial > 0,
                                       verbose=2 if args.verbose else 1)
        else:
            results, searcher = fit(spec, space, num_samples=args.samples, scale=args.scale, fusion=args.fusion,
                             scheduler=asha(spec) if args.scheduler == "asha" else None,
                             searcher=optuna_tpe(args.seed) if args.searcher == "optuna" else None,
                             transfer_fraction=None if args.no_target else args.transfer_fraction,
                             storage_path=args.storage, name=args.name, max_failures=args.max_failures,
                             seed=args.seed, data=data, energy=energy, verbose=2 if args.verbose else 1,
                             bubbles=args.bubbles, gpus_per_trial=args.gpus_per_trial, placement=args.placement,
                             **transfer_options(args))
    except TuningFailed as failed:
        _print_members(failed.results, spec, rows)
        print(f"\nhydro tune: {failed}\nwritten: {os.path.join(failed.results.experiment_path, MEMBER_TABLE_FILE)}",
              file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - start
    scale = f"{searcher.scale}, chosen by --scale auto" if args.scale == AUTO else args.scale
    print(f"\nHydro: {args.samples} members (scale {scale}, fusion {args.fusion}) in {elapsed:.0f} s\n")
    _print_members(results, spec, rows)
    best = best_configuration(results, spec)
    print(f"\nbest configuration ({best['kind']}, {spec.metric} = {best['value']:.4f}): {best['config']}")
    run_dir = results.experiment_path
    if best["checkpoint"] is not None:
        print(f"trained full-size model: {best['checkpoint']} (your model, trained: "
              f"hydro.tune.load_model({run_dir!r}))")
    print(f"written: {os.path.join(run_dir, MEMBER_TABLE_FILE)}, {os.path.join(run_dir, BEST_FILE)}")
    return _target_missing(results, spec, args, with_target=searcher.driver.policy.fraction is not None)


def _target_missing(results, spec: TuneSpec, args: argparse.Namespace, with_target: bool) -> int:
    """0, or 1 after one line on stderr when the run should have trained its full-size target (``with_target``: it
    has transfer stages, no --no-target) and did not (its trials were lost more often than --max-failures allows,
    or the target failed): the answer printed is then a surrogate's."""
    best = best_configuration(results, spec)
    if not with_target or best is None or best["kind"] == TrialKind.TARGET:
        return 0
    print(f"\nhydro tune: the run ended without its full-size target: the configuration above is a {best['kind']}'s, "
          f"not checked at full size (see the warnings above); go on with it: hydro tune "
          f"{'--example ' + args.example if args.example else '--workload ' + args.workload} --resume "
          f"{results.experiment_path} (with --max-failures higher), or ask for no target (--no-target)",
          file=sys.stderr)
    return 1


def starts_local(address: str | None) -> bool:
    """Whether :func:`connect` would start an embedded local cluster (none joined yet, no address given)."""
    import ray

    return not ray.is_initialized() and not (address or os.environ.get("RAY_ADDRESS"))


def connect(address: str | None) -> bool:
    """Join the cluster at ``address`` (or ``$RAY_ADDRESS``, as inside ``ray job submit``), with token
    authentication when this machine has a Ray token (``~/.ray/auth_token``, which Ray 2.60's ``ray start``
    turns on authentication with); else start an embedded local cluster bound to 127.0.0.1 whose workers
    import this checkout of Hydro. Returns whether it started the embedded cluster."""
    import ray

    if ray.is_initialized():
        return False
    if address or os.environ.get("RAY_ADDRESS"):
        # As `ray start` does: RAY_AUTH_MODE unset and a token on this machine -> token authentication.
        where = address or os.environ["RAY_ADDRESS"]
        _reachable(where)
        ray_internals.enable_token_auth_if_token_available()
        if token_refused(where):
            has_token = ray_internals.token_auth_enabled() and ray_internals.has_token()
            refused = "refused this machine's Ray token" if has_token else "wants a token and this machine has none"
            raise UsageError(f"hydro tune: the Ray cluster at {where} {refused}; put the cluster's token in "
                             f"~/.ray/auth_token here (or $RAY_AUTH_TOKEN)")
        if not ray_internals.token_auth_enabled():
            logger.warning("hydro tune: joining the Ray cluster at %s without authentication: anyone who can reach "
                           "its ports can run code on it; start it with token authentication (RAY_AUTH_MODE=token "
                           "ray start --head ...; its token in ~/.ray/auth_token here) or bind it to 127.0.0.1", where)
        try:
            ray.init(address=address)
        except (ConnectionError, RuntimeError) as error:
            lines = str(error).strip().splitlines()
            raise UsageError(f"hydro tune: could not join the Ray cluster at {where} ({type(error).__name__}: "
                             f"{lines[0] if lines else ''}); if it uses token authentication, put its token in "
                             f"~/.ray/auth_token or $RAY_AUTH_TOKEN") from None
        return False
    start_local_cluster()
    return True


def _reachable(address: str, timeout_s: float = 10.0) -> None:
    """Refuse a ``host:port`` cluster address where nothing listens (Ray would retry connecting forever)."""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return  # Ray resolves these itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        raise UsageError(f"hydro tune: no Ray cluster answers at {address} ({error}); start one there with "
                         f"`ray start --head --port {port}`, fix --address / $RAY_ADDRESS, or leave both out for "
                         f"an embedded local cluster") from None


def _print_members(results, spec: TuneSpec, rows: int | None) -> None:
    """The member table, the returned target first: its first ``rows`` rows (``None``: all), then what its
    columns and member names mean."""
    table = member_table(results, spec)
    shown = table.drop(columns=["error"]).rename(columns=lambda c: c.removeprefix("config/"))
    if "stop_epoch" in shown:
        shown["stop_epoch"] = [STILL_TRAINING if pd.isna(v) else int(v) for v in shown["stop_epoch"]]
    with pd.option_context("display.width", 200, "display.max_columns", 20, "display.max_rows", None):
        print(shown.head(rows).to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    if rows is not None and len(table) > rows:
        print(f"... {len(table) - rows} more rows in {MEMBER_TABLE_FILE} (hydro tune --verbose prints them all)")
    print(LEGEND)
