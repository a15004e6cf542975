"""``fit``: one call that tunes a ``TuneSpec`` with ``HydroSearcher`` on Ray Tune and writes the results."""
from __future__ import annotations

import atexit
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher
from ray.tune.search.sample import Categorical

from hydro.checks import is_count
from hydro.energy.tuning import EnergySettings
from hydro.trial.check import WorkloadError, check_any_workload, check_group_by, describe
from hydro.trial.data import DataSource
from hydro.trial.spec import TuneSpec
from hydro.tune.cluster import ray_internals
from hydro.tune.cluster import sessions as ray_sessions
from hydro.tune.bubbles.scheduler import BubbleScheduler
from hydro.tune.bubbles.service import write_stage_decisions
from hydro.tune.energy.scheduler import check_batch_sizes, for_hydro
from hydro.tune.bubbles.fill_trainable import bubble_fill
from hydro.tune.placement.gpu_types import require_gpu_types
from hydro.tune.placement.trial_placement import TrialPlacement, check_placement
from hydro.tune.search.progress import MemberProgress, show_progress
from hydro.tune.cluster.output import ray_output
from hydro.tune.cluster.worker_env import worker_env_vars
from hydro.tune.search.random_search import RandomSearch
from hydro.tune.search.results import failure_summary, failures_line, write_results
from hydro.tune.search.retry_logs import KeepResultsOnRetry
from hydro.tune.search.searcher import HydroSearcher
from hydro.tune.search.space_check import check_batch_size_space, other_values
from hydro.tune.search.trainable import require_resources, trainable, trial_resources
from schedulers.scale_choice import AUTO, AUTO_SCALES

logger = logging.getLogger(__name__)


def check_storage(storage_path: str | None) -> str | None:
    """The run directory root ``storage_path`` as Ray takes it: a local path made absolute (and made, if missing),
    checked writable before Ray starts; a URI (``s3://...``) or ``None`` (Ray's default) as given. Raises
    ``ValueError`` naming the path and the reason."""
    if storage_path is None or "://" in storage_path:
        return storage_path
    path = os.path.abspath(os.path.expanduser(storage_path))
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".hydro-write-check-"):
            pass
    except OSError as error:
        raise ValueError(f"hydro: the storage path {path} is not a folder Hydro can write to ({describe(error)}); "
                         f"give a writable one (storage_path=..., hydro tune --storage)") from None
    return path


def start_local_cluster() -> None:
    """Start a Ray cluster of this machine for this process, as ``hydro tune`` does: every process listening on
    127.0.0.1 only, no dashboard, workers that import this checkout of Hydro and the driver's ``PYTHONPATH`` and
    run OpenMP with passive waits (:func:`~hydro.tune.cluster.worker_env.worker_env_vars`); at
    exit it is shut down and its session folder removed. Its session folder is marked as this driver's, with a
    watchdog that cleans it up should this process be killed; sessions earlier Hydro drivers left behind that way
    are cleaned here too (:mod:`hydro.tune.cluster.sessions`)."""
    ray_internals.bind_local_cluster_to_loopback()
    # address="local": a cluster of its own, never one ``ray start`` left on this machine (whose address Ray
    # would otherwise read from its temp folder and join, or wait for when it is gone)
    ray.init(address="local", include_dashboard=False, runtime_env={"env_vars": worker_env_vars()})
    context = ray.get_runtime_context()
    session_dir = os.path.join(context.get_temp_dir(), context.get_session_name())
    ray_sessions.mark(session_dir)
    ray_sessions.spawn_watchdog(session_dir)
    ray_sessions.sweep(os.path.dirname(session_dir))
    atexit.register(_shut_down, session_dir)


def _shut_down(session_dir: str) -> None:
    """Stop the cluster :func:`start_local_cluster` started (its agents too) and remove its session folder."""
    ray.shutdown()
    ray_sessions.remove_session(session_dir)


def asha(spec: TuneSpec) -> ASHAScheduler:
    """Per-member ASHA over the spec's epochs: rungs at 1, 2, 4, ... epochs, keeping the best half."""
    return ASHAScheduler(time_attr="training_iteration", max_t=spec.epochs, grace_period=1, reduction_factor=2)


def optuna_tpe(seed: int = 0) -> Searcher:
    """Optuna's TPE sampler as a Ray searcher (seeded)."""
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed))


def trial_dirname(trial) -> str:
    """Short trial directory names (the default spells out every member's configuration)."""
    return f"{trial.trainable_name}_{trial.trial_id}"


def prepare(spec: TuneSpec, param_space: dict, *, scale: int | str = 1, seed: int = 0) -> tuple[DataSource, DataSource]:
    """Load the workload's data and check the workload on it, in this process (no Ray): two fused members of
    one configuration drawn from ``param_space`` at ``scale`` (``"auto"``: at the finest scale it may choose,
    S=2) and the full-size target, one batch each. Returns the data; raises
    :class:`~hydro.trial.check.WorkloadError` naming what failed."""
    if scale != AUTO and not is_count(scale):
        raise WorkloadError(f"hydro: scale must be an integer >= 1 (1 = full size) or 'auto', got {scale!r}")
    if not isinstance(param_space, dict) or not param_space:
        raise WorkloadError(f"hydro: param_space must be a dict of the hyperparameters to tune, e.g. "
                            f"{{'lr': tune.loguniform(1e-4, 1e-1)}}; got {param_space!r}")
    check_space(param_space)
    check_batch_size_space(param_space)
    data = spec.load_data()
    draws = RandomSearch(param_space, seed=seed)  # its first draw: _checked_config's
    configs = (draws.suggest(f"check{i}") for i in range(CHECKED_CONFIGS))
    passed = check_any_workload(spec, configs, AUTO_SCALES[-1] if scale == AUTO else scale, data)
    if passed != _checked_config(param_space, seed):
        logger.warning("hydro: the configuration %s fails numerically in the workload check (it diverges at once; "
                       "drawn in the run, its members fail alone); %s passed it", _checked_config(param_space, seed),
                       passed)
    check_group_by(spec, passed, other_values(param_space, passed, seed), mup=scale != 1)
    return data


CHECKED_CONFIGS = 4  # configurations :func:`prepare` tries when one fails numerically before refusing the space


def _checked_config(param_space: dict, seed: int) -> dict:
    """The configuration :func:`prepare` checks the workload with first (and ``fit`` measures ``scale="auto"`` on)."""
    return RandomSearch(param_space, seed=seed).suggest("check")


def check_space(param_space: Mapping, prefix: str = "") -> None:
    """Raise ``ValueError`` for a search-space entry no configuration can be drawn from (``tune.choice([])``, an
    empty ``grid_search``), naming its key."""
    for key, value in param_space.items():
        name = f"{prefix}{key}"
        if isinstance(value, Categorical) and not value.categories:
            raise ValueError(f"hydro: param_space[{name!r}] is tune.choice([]): it has no value to draw; give it at "
                             f"least one (tune.choice([a, b])) or leave the key out")
        if isinstance(value, Mapping) and "grid_search" in value and not list(value["grid_search"]):
            raise ValueError(f"hydro: param_space[{name!r}] is tune.grid_search([]): it has no value to train; give "
                             f"it at least one or leave the key out")
        if isinstance(value, Mapping) and "grid_search" not in value:
            check_space(value, f"{name}.")


class TuningFailed(RuntimeError):
    """No member (nor the target) ended with a finite objective; ``results``/``searcher`` hold what ran."""

    def __init__(self, message: str, results: tune.ResultGrid, searcher: HydroSearcher) -> None:
        super().__init__(message)
        self.results, self.searcher = results, searcher


def check_arguments(spec: TuneSpec, param_space: dict, *, energy: EnergySettings | None = None,
                    bubbles: bool = False, cpus_per_trial: float = 1, gpus_per_trial: float = 0) -> None:
    """Raise ``ValueError`` for arguments of :func:`fit` that cannot work together (checked before anything
    loads or runs; ``hydro tune`` calls it before Ray starts)."""
    if energy is not None and energy.batch_sizes and "batch_size" in param_space:
        raise ValueError("hydro tune --energy: the batch size is chosen per fused group by the energy bandit; remove "
                         "'batch_size' from the param space, or turn the bandit off (--energy-batch-sizes with no "
                         "value / EnergySettings(batch_sizes=()))")
    if energy is not None:
        check_batch_sizes(energy, spec)
    if bubbles and gpus_per_trial:
        raise ValueError("hydro: bubble filling runs fused trials on the pipeline stages' own devices; "
                         "gpus_per_trial does not apply with bubbles=True (--bubbles): leave it at 0")
    trial_resources(spec, cpus_per_trial, gpus_per_trial)


def fit(spec: TuneSpec, param_space: dict, *, num_samples: int, scale: int | str = 1, fusion: int | str = "auto",
        max_fusion: int = 64, scheduler: TrialScheduler | None = None, searcher: Searcher | None = None,
        transfer_fraction: float | None = 1.0, storage_path: str | None = None, name: str | None = None,
        max_concurrent_trials: int | None = None, max_failures: int = 1, seed: int = 0, verbose: int = 1,
        callbacks: Sequence[tune.Callback] = (), data: tuple[DataSource, DataSource] | None = None,
        energy: EnergySettings | None = None, bubbles: bool = False, cpus_per_trial: float = 1,
        gpus_per_trial: float = 0, placement: str | None = None, **transfer) -> tuple[tune.ResultGrid, HydroSearcher]:
    """Tune ``num_samples`` member configurations of ``param_space``; returns the ``ResultGrid`` (member
    table and best configuration written to its directory) and the searcher. ``scale``: the surrogates' width
    divisor, or ``"auto"``, measured here before Ray starts, its pilot on configurations drawn from
    ``param_space`` (``HydroSearcher``; the searcher's ``scale`` is then the chosen one).

    ``data``: what :func:`prepare` returned (default: ``fit`` calls it), so the workload is checked in this
    process before any trial starts. ``verbose``: 0 silent, 1 member
    progress (logger ``hydro.tune.search.progress``), 2 also Ray's trial table and log lines
    (:mod:`hydro.tune.cluster.output`). ``max_failures``: retries of a trial whose process or storage was lost
    (killed, e.g. by the OOM killer; a lost node; a hung fill; a checkpoint that could not be written) from its
    last checkpoint, then as many fresh trials of its members (``HydroSearcher(lost_trial_retries=...)``), so that
    a stage does not go on without them; an exception of the trial's own code (building or training its members)
    fails its live members without a retry, and the run logs a summary of the members that failed and why. Ray
    started here (none was initialised) is :func:`start_local_cluster`'s: listening on 127.0.0.1 only. ``energy``:
    energy-tune the trials (:func:`hydro.tune.energy.scheduler.for_hydro` schedules them). ``bubbles``: the fused
    trials run in the bubbles of the pipeline jobs registered with the cluster's placement service (late-stage
    trials and the target on its dedicated workers; see :mod:`hydro.tune.bubbles.fill_trainable`).
    ``cpus_per_trial``/``gpus_per_trial``: each trial's Ray resources (fractional GPUs share a card; see
    ``trainable``). With GPUs and ``fusion="auto"``, fusion is planned where the trials run (the driver may have
    no GPU): the searcher hands out up to ``max_fusion`` members per trial, each trial measures how many fit and
    train fast on its device and trains them in chunks of that many, and the group's later trials get that
    many members. Fused or planned, a search trial holds at most an even share of ``num_samples`` per trial that
    trains at once (``cpus_per_trial``/``gpus_per_trial`` tell the searcher the cluster's trial slots; see
    ``HydroSearcher``). ``transfer``: the transfer stages' options of ``HydroSearcher`` (``ladder``, ``eta``,
    ``top_k``, ``seeds``, ``min_agreement``, ``max_target_drop``, ``escalate``, ``disagreement``, ``probes``,
    ``probe_margin``, ``fallback_targets``). ``placement="elastic"``: each trial runs on the GPU type of the
    cluster's nodes (declared as ``hydro_gpu:<type>`` resources, or detected) where it is predicted to finish
    first (:mod:`hydro.tune.placement.trial_placement`); with ``energy``, of least predicted energy cost once every
    type's trials have measured it; the survivors of search trials of one fused group merge into one trial when
    that frees a GPU (:mod:`hydro.tune.placement.trial_merging`); with ``bubbles``, only the full-size targets are
    placed (the other trials fill the bubbles) and nothing merges.
    Raises ``ValueError`` (or ``TypeError``) before Ray starts for
    arguments that cannot work (:func:`check_arguments`, :func:`check_storage`, :func:`prepare`, ``HydroSearcher``'s own
    checks), and when
    no node of a cluster that ``fit`` started itself has a trial's resources (a connected cluster may autoscale: a
    warning); raises :class:`TuningFailed` (after writing the member table) when no member ends with a finite
    objective."""
    check_arguments(spec, param_space, energy=energy, bubbles=bubbles, cpus_per_trial=cpus_per_trial,
                    gpus_per_trial=gpus_per_trial)
    storage_path = check_storage(storage_path)
    # Keeping 2 checkpoints per trial makes Tune snapshot the experiment often; its warning about that is noise.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    data = data if data is not None else prepare(spec, param_space, scale=scale, seed=seed)
    check_placement(placement, spec, data, local_cluster=not ray.is_initialized())
    in_trial = fusion == "auto" and gpus_per_trial > 0
    hydro_searcher = HydroSearcher(spec, searcher, num_samples=num_samples, scale=scale,  # checks its arguments
                                   fusion=max_fusion if in_trial else fusion,             # before Ray starts
                                   max_fusion=max_fusion, scheduler=scheduler, transfer_fraction=transfer_fraction,
                                   seed=seed, data=data, trial_cpus=max(1, int(cpus_per_trial)), run_reporter=False,
                                   lost_trial_retries=max_failures, placement=None if placement is None else
                                   TrialPlacement(spec, data, energy_eta=None if energy is None else energy.eta,
                                                  bubbles=bubbles),
                                   trial_resources={} if bubbles else {"CPU": cpus_per_trial, "GPU": gpus_per_trial},
                                   **transfer)  # fill trials train in the bubbles of the jobs' own devices
    hydro_searcher.choose_scale(_checked_config(param_space, seed), param_space)  # "auto": before Ray starts
    started = not ray.is_initialized()
    if started:  # a local cluster of this machine, which cannot grow to fit a trial
        with ray_output(verbose >= 2):
            start_local_cluster()
    if not bubbles:  # fill trials run on the placement service's hosts, not on resources of their own
        require_resources(trial_resources(spec, cpus_per_trial, gpus_per_trial), strict=started)
    if placement is not None:
        require_gpu_types()
    progress = [MemberProgress(spec.metric, spec.mode, num_samples)] if verbose >= 1 else []
    if progress:
        show_progress()
    tuner = tune.Tuner(
        bubble_fill(spec, energy) if bubbles else
        trainable(spec, data, energy, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial,
                  plan_fusion=in_trial, quiet=verbose < 2),
        param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=hydro_searcher, num_samples=-1, metric=spec.metric, mode=spec.mode,
                                    scheduler=_scheduler(spec, energy, bubbles, seed),
                                    reuse_actors=True, max_concurrent_trials=max_concurrent_trials,
                                    trial_dirname_creator=trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=1 if verbose >= 2 else 0,
                                  callbacks=[*progress, KeepResultsOnRetry(), *callbacks],
                                  failure_config=tune.FailureConfig(max_failures=max_failures),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )
    with ray_output(verbose >= 2):
        results = tuner.fit()
    return _finish(results, spec, hydro_searcher, bubbles)


def _scheduler(spec: TuneSpec, energy: EnergySettings | None, bubbles: bool, seed: int) -> TrialScheduler | None:
    """The run's trial scheduler: with bubbles, :class:`BubbleScheduler` over the energy scheduler (fill trials
    unmetered: it chooses their batch sizes); without, the energy scheduler or Tune's default."""
    chosen = None if energy is None else for_hydro(energy, spec, seed, metered=not bubbles)
    return BubbleScheduler(chosen) if bubbles else chosen


def resume(run_dir: str, spec: TuneSpec, *, data: tuple[DataSource, DataSource] | None = None,
           energy: EnergySettings | None = None, bubbles: bool = False, cpus_per_trial: float = 1,
           gpus_per_trial: float = 0, plan_fusion: bool = False,
           verbose: int = 1) -> tuple[tune.ResultGrid, HydroSearcher]:
    """Go on with the :func:`fit` run in ``run_dir`` (interrupted, or ended with errored trials) from its last
    experiment checkpoint: its searcher's state, its trials' checkpoints, errored trials retried. ``spec`` and the
    trial options are the run's own (its trainable is built again from them; ``data``: as :func:`prepare`
    returned it, the default loads it in each trial). Ray started here (none was initialised) is
    :func:`start_local_cluster`'s, listening on 127.0.0.1 only (``tune.Tuner.restore`` alone would start one on every
    interface). Returns and raises as :func:`fit`; raises ``ValueError`` when ``run_dir`` holds no run."""
    run_dir = check_run_dir(run_dir)
    if not ray.is_initialized():
        with ray_output(verbose >= 2):
            start_local_cluster()
    function = bubble_fill(spec, energy) if bubbles else trainable(spec, data, energy, cpus_per_trial=cpus_per_trial,
                                                            gpus_per_trial=gpus_per_trial, plan_fusion=plan_fusion,
                                                            quiet=verbose < 2)
    tuner = tune.Tuner.restore(run_dir, function, resume_errored=True)
    searcher = ray_internals.restored_search_alg(tuner)  # Tune restores its state from the run's checkpoint
    if not isinstance(searcher, HydroSearcher):
        raise ValueError(f"hydro: {run_dir} is a Ray Tune run without a HydroSearcher; resume it with "
                         f"tune.Tuner.restore")
    with ray_output(verbose >= 2):
        results = tuner.fit()
    return _finish(results, spec, searcher, bubbles)


def check_run_dir(run_dir: str) -> str:
    """``run_dir`` made absolute, checked to hold a run :func:`resume` can go on with and to be writable; raises
    ``ValueError`` otherwise."""
    path = os.path.abspath(os.path.expanduser(run_dir))
    if not tune.Tuner.can_restore(path):
        raise ValueError(f"hydro: {path} holds no run to resume (no tuner.pkl): give the run's folder, "
                         f"<storage>/<name>, as the run printed it")
    return check_storage(path)


def _finish(results: tune.ResultGrid, spec: TuneSpec, searcher: HydroSearcher,
            bubbles: bool = False) -> tuple[tune.ResultGrid, HydroSearcher]:
    """Write the run's results (with ``bubbles``, the pipeline stages' slack decisions too); raise
    :class:`TuningFailed` when no member has a finite objective, else log the members that failed."""
    _, best = write_results(results, spec)
    if bubbles:
        write_stage_decisions(results.experiment_path)
    if best is None:
        raise TuningFailed(failure_summary(results, searcher.rejected_members()), results, searcher)
    line = failures_line(results, searcher.rejected_members())
    if line:
        logger.warning(line)
    return results, searcher
