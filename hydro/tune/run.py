"""``fit``: one call that tunes a ``TuneSpec`` with ``HydroSearcher`` on Ray Tune and writes the results."""
from __future__ import annotations

import os

from ray import tune
from ray.tune.schedulers import ASHAScheduler, TrialScheduler
from ray.tune.search import Searcher

from hydro.tune.results import write_results
from hydro.tune.searcher import HydroSearcher
from hydro.trial.spec import TuneSpec
from hydro.tune.trainable import trainable


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


def fit(spec: TuneSpec, param_space: dict, *, num_samples: int, scale: int = 1, fusion: int | str = "auto",
        max_fusion: int = 64, scheduler: TrialScheduler | None = None, searcher: Searcher | None = None,
        transfer_fraction: float | None = 1.0, storage_path: str | None = None, name: str | None = None,
        max_concurrent_trials: int | None = None, max_failures: int = 1, seed: int = 0, verbose: int = 1,
        **transfer) -> tuple[tune.ResultGrid, HydroSearcher]:
    """Tune ``num_samples`` member configurations of ``param_space``; returns the ``ResultGrid`` (member
    table and best configuration written to its directory) and the searcher. ``transfer``: the transfer
    stages' options of ``HydroSearcher`` (``ladder``, ``eta``, ``top_k``, ``seeds``, ``min_agreement``)."""
    # Keeping 2 checkpoints per trial makes Tune snapshot the experiment often; its warning about that is noise.
    os.environ.setdefault("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "0")
    data = spec.load_data()  # once, in the driver: the searcher plans fusion with it, trials get it from Ray
    hydro_searcher = HydroSearcher(spec, searcher, num_samples=num_samples, scale=scale, fusion=fusion,
                                   max_fusion=max_fusion, scheduler=scheduler, transfer_fraction=transfer_fraction,
                                   seed=seed, data=data, **transfer)
    tuner = tune.Tuner(
        trainable(spec, data), param_space=param_space,
        tune_config=tune.TuneConfig(search_alg=hydro_searcher, num_samples=-1, metric=spec.metric, mode=spec.mode,
                                    reuse_actors=True, max_concurrent_trials=max_concurrent_trials,
                                    trial_dirname_creator=trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=storage_path, verbose=verbose,
                                  failure_config=tune.FailureConfig(max_failures=max_failures),
                                  checkpoint_config=tune.CheckpointConfig(num_to_keep=2)),
    )
    results = tuner.fit()
    write_results(results, spec)
    return results, hydro_searcher
