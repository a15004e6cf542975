"""A Ray Tune scheduler that sends late-stage trials from pipeline bubbles to dedicated workers.

It wraps any trial scheduler (FIFO by default; ASHA for multi-fidelity searches): the base decides whether
a trial continues, and every result it lets continue tells the placement service
(:mod:`hydro.tune.bubbles.service`) how far the trial got (``time_attr``). Trials past the service's
``promote_rung`` — the survivors of the base's early rungs — move to a free dedicated worker, so the best
late-stage trials are not slowed by bubble-only execution.
"""
from __future__ import annotations

import ray
from ray.tune.experiment import Trial
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from hydro.tune.bubbles.service import SERVICE_NAME


class BubbleScheduler(TrialScheduler):
    """``base`` decides (FIFO if ``None``); results it lets continue report ``result[time_attr]`` to the
    placement service (promotion), and trials it stops, or that fail, have their fill trials stopped."""

    def __init__(self, base: TrialScheduler | None = None, time_attr: str = "epoch") -> None:
        super().__init__()
        self.base = base or FIFOScheduler()
        self.time_attr = time_attr

    def set_search_properties(self, metric: str | None, mode: str | None, **spec) -> bool:
        return self.base.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller, trial: Trial) -> None:
        self.base.on_trial_add(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial: Trial) -> None:
        self.base.on_trial_error(tune_controller, trial)
        _stop(trial)

    def on_trial_result(self, tune_controller, trial: Trial, result: dict) -> str:
        decision = self.base.on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.CONTINUE and self.time_attr in result:
            service = ray.get_actor(SERVICE_NAME)
            ray.get(service.promote.remote(trial.trial_id, result[self.time_attr]))
        elif decision == TrialScheduler.STOP:  # Tune ends the proxy; its fill trial on a host must end too
            _stop(trial)
        return decision

    def on_trial_complete(self, tune_controller, trial: Trial, result: dict) -> None:
        self.base.on_trial_complete(tune_controller, trial, result)

    def on_trial_remove(self, tune_controller, trial: Trial) -> None:
        self.base.on_trial_remove(tune_controller, trial)
        _stop(trial)

    def choose_trial_to_run(self, tune_controller) -> Trial | None:
        return self.base.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return f"BubbleScheduler over {self.base.debug_string()}"

    def save(self, checkpoint_path: str) -> None:
        self.base.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.base.restore(checkpoint_path)


def _stop(trial: Trial) -> None:
    ray.get(ray.get_actor(SERVICE_NAME).stop_trial.remote(trial.trial_id))
