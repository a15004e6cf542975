"""The Ray Tune function trainable: trains one trial's members (the fused-trial unit,
:class:`hydro.trial.unit.FusedTrial`) and reports per-member metrics every epoch (a ladder rung's trial,
``TrialPlan.final_score_only``, evaluates only its last epoch and its halving milestones: its other reports hold
``train_loss`` and NaN validation metrics).

Surrogate trials (from a ``HydroSearcher``) train their members fused and shrunk; after each epoch the
run's member-decision service says which members stop, and those are sliced out with their state
(``hydro.keep_members``). Target and plain trials train one full-size model with the user's own torch
optimizer, except the target of a shrunk (µP) run: ``hydro.shrink(model, 1)`` with the translated
``hydro.optim`` optimizer, which applies the µP multipliers. Every ``TuneSpec.checkpoint_every`` epochs,
and after the last, a checkpoint holds the unit's state (member weights, optimizer state, surviving member
ids, epoch, RNG state), so a retried or restored trial resumes from there: it replays the epochs after it exactly
(same batches, same decisions), and the searcher keeps the first report of each member's epoch. An exception
of the trial's own code (the user's model, loss or data, building the members) fails its live members with that
cause instead of reaching Tune (it would raise again on a retry); a killed worker, or a checkpoint that could not be
written (storage), is retried.
"""
from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable

import ray
import torch
from ray import tune

from hydro.energy.observer import EnergyObserver
from hydro.energy.tuning import EnergySettings, trial_observer
from hydro.trial.check import describe
from hydro.trial.data import DataSource
from hydro.trial.device import resolve_device
from hydro.trial.fusion import fusion_in_trial, plans_in_process
from hydro.trial.plan import plan_of
from hydro.trial.memory import gpu_share_bytes
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import templates_in_process
from hydro.trial.unit import FusedTrial
from hydro.tune.cluster.output import quiet_trial
from hydro.tune.placement.gpu_types import PLACEMENT_KEY
from hydro.tune.placement.trial_merging import hand_over_if_due, merged_state
from hydro.tune.search.session import TRIAL_CPUS_KEY, TRIAL_GPUS_KEY, MemberSession, TrialLost

logger = logging.getLogger(__name__)

STATE_FILE = "hydro_trial.pt"


def _process_started_at() -> float:
    """When this process started, in seconds since the epoch (Linux: from /proc, good to about 1 s; elsewhere:
    now, when this module is first imported in it)."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/stat") as system:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
            boot = next(int(line.split()[1]) for line in system if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return time.time()


_PROCESS_STARTED_AT = _process_started_at()
_TRIALS_IN_PROCESS = 0  # trials this process has run (1: a fresh worker)


def trainable(spec: TuneSpec, data: tuple[DataSource, DataSource] | None = None,
              energy: EnergySettings | None = None, *, cpus_per_trial: float = 1, gpus_per_trial: float = 0,
              plan_fusion: bool = False, quiet: bool = False) -> Callable[[dict], None]:
    """A function trainable for ``tune.Tuner``/``tune.run``: Hydro trials when the config comes from a
    ``HydroSearcher``, one plain full-size unfused training otherwise (the stock Ray Tune baseline).

    ``data``: ``spec.load_data()`` already loaded by the driver; it is put in Ray's object store once
    (``tune.with_parameters``, so Ray must be initialised) instead of every trial loading it. Without it,
    each trial calls ``spec.load_data()``. ``energy``: measure each trial's energy (``hydro tune --energy``).
    ``cpus_per_trial``/``gpus_per_trial``: each trial's Ray resources
    (``tune.with_resources``; fractional GPUs below 1 share a card); with ``TuneSpec.device="auto"`` a trial
    given a GPU trains on it. ``plan_fusion``: a surrogate trial measures how many of its members to train
    fused at once on its own device, precision and memory (once per group in each trial process; see
    :func:`hydro.trial.fusion.fusion_in_trial`) and trains them in chunks of that many. ``quiet``: leave Ray's log
    line of each checkpoint out of the trials' output (:func:`~hydro.tune.cluster.output.quiet_trial`)."""
    resources = trial_resources(spec, cpus_per_trial, gpus_per_trial)
    if data is None:
        def hydro_trial(config: dict) -> None:
            if quiet:
                quiet_trial()
            run_trial(spec, config, energy=energy, plan_fusion=plan_fusion)

        function = hydro_trial
    else:
        def hydro_trial(config: dict, data: tuple[DataSource, DataSource]) -> None:  # the same name: restorable
            if quiet:                                                                # either way
                quiet_trial()
            run_trial(spec, config, data, energy, plan_fusion=plan_fusion)

        function = tune.with_parameters(hydro_trial, data=data)
    request = {name.upper(): amount for name, amount in resources.items()}

    def trial_request(config: dict) -> tune.PlacementGroupFactory:
        # one request for every plan but a wider one (Tune reuses a worker only for a trial of the same request):
        # a wider plan asks Ray for its CPUs, which it trains on as torch threads (run_trial); a placement adds its
        # GPU type's resource
        placed = dict(config[PLACEMENT_KEY].resources) if PLACEMENT_KEY in config else {}
        cpus = plan_of(config).cpus
        wider = {"CPU": float(cpus)} if cpus and cpus > request.get("CPU", 1.0) else {}
        return tune.PlacementGroupFactory([{**request, **wider, **placed}])

    return tune.with_resources(function, trial_request)


def trial_resources(spec: TuneSpec, cpus_per_trial: float = 1, gpus_per_trial: float = 0) -> dict[str, float]:
    """Ray resources of one trial, checked before anything runs."""
    if cpus_per_trial <= 0:
        raise ValueError(f"hydro.tune: cpus_per_trial must be > 0, got {cpus_per_trial}")
    if gpus_per_trial < 0 or (gpus_per_trial > 1 and gpus_per_trial != int(gpus_per_trial)):
        raise ValueError(f"hydro.tune: gpus_per_trial must be a fraction in [0, 1] or a whole number of GPUs "
                         f"(Ray's rule), got {gpus_per_trial}")
    if gpus_per_trial > 1:
        raise ValueError(f"hydro.tune: gpus_per_trial={gpus_per_trial:g}, but a fused trial trains on one GPU and "
                         f"would leave the others idle; use gpus_per_trial=1 (the searcher runs a trial per card) "
                         f"or a fraction to share cards")
    if gpus_per_trial == 0 and torch.device(spec.device if spec.device != "auto" else "cpu").type == "cuda":
        raise ValueError(f"hydro.tune: TuneSpec.device={spec.device!r} but gpus_per_trial=0: Ray gives such a "
                         f"trial no GPU; set gpus_per_trial (e.g. 1 or 0.5) or TuneSpec.device='auto'")
    return {"cpu": cpus_per_trial, **({"gpu": gpus_per_trial} if gpus_per_trial else {})}


def require_resources(resources: dict[str, float], strict: bool) -> None:
    """Check that some alive node of the Ray cluster has ``resources`` (one trial's, from
    :func:`trial_resources`) in all: otherwise Tune would wait for them forever. ``strict``: raise
    ``ValueError`` (a cluster that cannot grow, e.g. the local one Hydro started); else log a warning (an
    autoscaling cluster may add such a node)."""
    request = {name.upper(): amount for name, amount in resources.items()}
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    if any(all(node.get(name, 0.0) >= amount for name, amount in request.items()) for node in nodes):
        return
    largest = {name: max((node.get(name, 0.0) for node in nodes), default=0.0) for name in request}
    message = (f"hydro.tune: a trial asks for {_resources(request)} but no node of the Ray cluster has that much "
               f"(the most one node has: {_resources(largest)})")
    if strict:
        raise ValueError(f"{message}; this cluster is this machine's and cannot grow: lower cpus_per_trial / "
                         f"gpus_per_trial (--gpus-per-trial 0 on a machine without GPUs), or give the address of a "
                         f"cluster with such nodes (--address)")
    logger.warning("%s; the trials wait until the cluster adds such a node", message)


def _resources(amounts: dict[str, float]) -> str:
    return ", ".join(f"{amount:g} {name}" for name, amount in amounts.items())


def run_trial(spec: TuneSpec, config: dict, data: tuple[DataSource, DataSource] | None = None,
              energy: EnergySettings | None = None, *, plan_fusion: bool = False) -> None:
    """Train the trial described by ``config`` (see :mod:`hydro.trial.plan`) for ``spec.epochs`` on ``data``
    (default: ``spec.load_data()``), on the device of ``TuneSpec.device`` given the GPUs Ray assigned. With
    ``energy``, an :class:`~hydro.energy.observer.EnergyObserver` measures it: each member reports its
    ``energy_j``/``cost`` share, the trial its totals and ``member_epoch_cost``."""
    started = time.time()
    global _TRIALS_IN_PROCESS
    _TRIALS_IN_PROCESS += 1
    state = _restored_state() or merged_state(config)  # a merged trial starts from the states handed over
    warm = {"cached_plans": plans_in_process(), "cached_templates": templates_in_process()}
    session = MemberSession(config, spec.metric, spec.mode, state["member_ids"] if state else None,
                            state["epoch"] if state else 0)
    with session.failing():  # an error of the trial's own code fails its members; it is not retried
        torch.set_num_threads(granted_threads())  # set for every trial: a reused worker's last one may have differed
        gpu_ids = ray.get_gpu_ids()
        device = resolve_device(spec.device, gpu_ids)
        budget = _gpu_share_bytes(spec, device)
        clock = time.perf_counter()
        data = data if data is not None else spec.load_data()
        loaded = time.perf_counter()
        plan, fusion = session.plan, None
        if plan_fusion and plan.fused and not state:  # a restored trial takes the chunks of its checkpoint
            fusion = fusion_in_trial(spec, plan.members[0][1], plan.scale, data, len(session.member_ids), device,
                                     budget)
        planned = time.perf_counter()
        trial = FusedTrial(spec, plan, data, member_ids=session.member_ids, device=device,
                           memory_budget_bytes=budget, fusion=fusion)
        timing = {"trial_started_at": started, "worker_started_at": _PROCESS_STARTED_AT,
                  "worker_trials": _TRIALS_IN_PROCESS, "worker_pid": os.getpid(), **warm,
                  "torch_threads": torch.get_num_threads(), "setup_data_s": loaded - clock + trial.data_setup_s,
                  "setup_plan_s": planned - loaded, "setup_build_s": trial.build_s}
        if trial.fallback:
            logger.warning("training %d members unfused (fallback_unfused): %s", len(trial.member_ids),
                           trial.fallback)
        if state:
            trial.load_state_dict(state)
        share = ray.get_runtime_context().get_assigned_resources().get("GPU", 0)
        meter = None if energy is None else trial_observer(energy, trial, share if 0 < share < 1 else 1.0).start()
        try:
            if meter is not None:
                trial.observers.append(meter)
                if state and "energy" in state:
                    meter.load_state_dict(state["energy"])
            refused = None if meter is None else "the energy it measured does not merge"
            _train(spec, trial, session, meter, gpu_ids, timing, lambda: hand_over_if_due(config, trial, refused))
        finally:
            if meter is not None:
                meter.close()


def granted_threads() -> int:
    """The torch threads a trial trains with: the CPUs Ray granted it (at least 1). More threads than granted CPUs
    share cores with whatever else runs there, where OpenMP's spin-waiting threads slow every step many times."""
    return max(1, int(tune.get_context().get_trial_resources().required_resources.get("CPU", 1.0)))


def _train(spec: TuneSpec, trial: FusedTrial, session: MemberSession, meter: EnergyObserver | None,
           gpu_ids: list, timing: dict, hand_over: Callable[[], bool]) -> None:
    """Train and report every epoch; after each report, end if ``hand_over()`` handed the members over to a merge.
    Besides the metrics, each report holds where the trial's time went: ``timing`` (its start, its worker process's
    start and how many trials that process ran, set-up seconds) and seconds of training, evaluation and checkpoints
    so far (``checkpoint_s``: those before this report), ``reported_at``."""
    resources = tune.get_context().get_trial_resources().required_resources
    extra = {"fused": trial.fused, "device": str(trial.device), "gpu_ids": ",".join(map(str, gpu_ids)),
             TRIAL_CPUS_KEY: resources.get("CPU", 0.0), TRIAL_GPUS_KEY: resources.get("GPU", 0.0),
             "node_id": ray.get_runtime_context().get_node_id(), **timing}
    checkpoint_s = 0.0
    while trial.epoch < spec.epochs:
        halving = session.plan.halving
        evaluated = (not session.plan.final_score_only or trial.epoch + 1 == spec.epochs
                     or (halving is not None and halving.evaluates(trial.epoch + 1, spec.epochs))
                     or trial.evaluation_steers_training)
        metrics = trial.run_epoch(evaluate=evaluated)
        extra.update(max_fusion=trial.max_fusion, data_wait_fraction=trial.data_wait_s / max(trial.train_s, 1e-9),
                     train_s=trial.train_s, eval_s=trial.eval_s, checkpoint_s=checkpoint_s, reported_at=time.time())
        if meter is not None:
            metrics = {**metrics, **meter.member_metrics(trial.member_ids)}
            extra.update(meter.trial_metrics())
        keep = session.step(trial.epoch, metrics, final=trial.epoch == spec.epochs, extra=extra,
                            evaluated=evaluated)
        if keep and len(keep) < len(trial.member_ids):
            trial.keep(keep)
        if keep and trial.epoch % spec.checkpoint_every:  # keep is empty after the trial's last epoch
            session.report()
        else:
            start = time.perf_counter()
            state = trial.state_dict() if meter is None else {**trial.state_dict(), "energy": meter.state_dict()}
            _report_checkpoint(session, state)
            checkpoint_s += time.perf_counter() - start
        if not keep or hand_over():
            return


def _report_checkpoint(session: MemberSession, state: dict) -> None:
    """Report the last step with a checkpoint of ``state``. Raises :class:`~hydro.tune.search.session.TrialLost` when
    writing it fails (a full disk, a storage folder that is gone or read-only): a storage fault, which Tune retries
    (the trial's own code did not raise)."""
    try:
        with tempfile.TemporaryDirectory() as directory:
            torch.save(state, os.path.join(directory, STATE_FILE))  # torch raises RuntimeError for a failed write
            session.report(checkpoint=tune.Checkpoint.from_directory(directory))
    except (OSError, RuntimeError) as error:
        raise TrialLost(f"hydro: writing the trial's checkpoint failed (storage): {describe(error)}") from error


def _gpu_share_bytes(spec: TuneSpec, device: torch.device) -> int | None:
    """The memory budget of a trial given a fraction of a GPU: that fraction of the card less its CUDA context
    (unless ``TuneSpec.memory_budget_bytes`` sets one)."""
    share = ray.get_runtime_context().get_assigned_resources().get("GPU", 0)
    if spec.memory_budget_bytes is not None or device.type != "cuda" or not 0 < share < 1:
        return spec.memory_budget_bytes
    return gpu_share_bytes(share, torch.cuda.get_device_properties(device).total_memory)


def _restored_state() -> dict | None:
    checkpoint = tune.get_checkpoint()
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as directory:
        return torch.load(os.path.join(directory, STATE_FILE), map_location="cpu", weights_only=False)
