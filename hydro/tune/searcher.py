"""``HydroSearcher``: a Ray Tune ``Searcher`` that turns an inner searcher's configurations into fused trials.

Each Ray trial is one fused group of up to F members (configurations). Members are drawn from the inner
searcher under their own ids and grouped by ``TuneSpec.group_key`` (batch size and architecture-changing
values); every member's results go back to the inner searcher as its own observation. Once
``transfer_fraction`` of the members have finished (and at the end at the latest), one more trial trains
the full-size target with the best member's configuration (in µP when the members were shrunk, so their
hyperparameters transfer); the run's best result is the target's.
"""
from __future__ import annotations

import copy
import math
import os
import pickle
import tempfile
import uuid
from collections.abc import Mapping

from ray.tune.schedulers import TrialScheduler
from ray.tune.search import Searcher
from ray.tune.search.sample import Domain

from hydro.planning import plan_fusion
from hydro.tune.decisions import start_service
from hydro.tune.random_search import RandomSearch
from hydro.tune.session import MEMBERS_KEY
from hydro.tune.spec import Batch, TuneSpec
from hydro.tune.surrogate import build_member
from hydro.tune.trial_config import SURROGATE, TARGET, TrialPlan
from schedulers.member_stopping import MemberStopping

TARGET_MEMBER_ID = "target"
PLAN_STEPS = 10  # timed steps per fusion count: fewer make small surrogates' millisecond steps too noisy


class HydroSearcher(Searcher):
    """Search with ``searcher`` (any Ray ``Searcher``; ``None``: random/grid sampling of the param space)
    over ``num_samples`` member configurations, trained as fused surrogates of width ÷ ``scale``.

    ``fusion``: members per fused trial, or ``"auto"`` (measured with ``hydro.plan_fusion`` per group, at
    most ``max_fusion``). ``scheduler``: a Ray scheduler (e.g. ``ASHAScheduler(max_t=..., grace_period=1)``)
    that decides per member; leave its metric/mode unset. ``transfer_fraction``: fraction of members that
    must have finished before the full-size target trial starts (``None``: no target). Use it with
    ``TuneConfig(num_samples=-1)``: this searcher says when the run has no more trials. ``data``: the
    ``spec.load_data()`` the driver already loaded, to plan fusion with (default: loaded when needed).
    ``trial_cpus``: CPUs (torch threads) each trial trains with (Tune's default: 1); ``plan_fusion`` measures
    with as many.
    """

    def __init__(self, spec: TuneSpec, searcher: Searcher | None = None, *, num_samples: int, scale: int = 1,
                 fusion: int | str = "auto", max_fusion: int = 64, scheduler: TrialScheduler | None = None,
                 transfer_fraction: float | None = 1.0, seed: int | None = None,
                 data: tuple[Batch, Batch] | None = None, trial_cpus: int = 1) -> None:
        super().__init__(metric=spec.metric, mode=spec.mode)
        if num_samples < 1:
            raise ValueError(f"num_samples (member configurations) must be >= 1, got {num_samples}")
        if fusion != "auto" and (not isinstance(fusion, int) or fusion < 1):
            raise ValueError(f"fusion must be 'auto' or an int >= 1, got {fusion!r}")
        if transfer_fraction is not None and not 0 < transfer_fraction <= 1:
            raise ValueError(f"transfer_fraction must be in (0, 1] or None, got {transfer_fraction}")
        self.spec, self.num_samples, self.scale, self.fusion = spec, num_samples, scale, fusion
        self.max_fusion, self.transfer_fraction = max_fusion, transfer_fraction
        if trial_cpus < 1:
            raise ValueError(f"trial_cpus must be >= 1, got {trial_cpus}")
        self._data, self.trial_cpus = data, trial_cpus
        self.inner = searcher if searcher is not None else RandomSearch(seed=seed)
        self._stopping = MemberStopping(scheduler, spec.metric, spec.mode) if scheduler is not None else None
        self._service_name = f"hydro-member-decisions-{uuid.uuid4().hex[:12]}"
        self._service = None
        self._space: dict = {}
        self._fusion_by_key: dict[tuple, int] = {}
        self._buffers: dict[tuple, list[tuple[str, dict]]] = {}
        self._drawn = 0
        self._inner_finished = False
        self._trials: dict[str, list[str]] = {}  # trial id -> member ids ([TARGET_MEMBER_ID] for the target)
        self._configs: dict[str, dict] = {}
        self._last: dict[str, dict] = {}
        self._done: dict[str, dict] = {}
        self._target_trial: str | None = None

    # --- Ray Tune Searcher API -------------------------------------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec) -> bool:
        if metric and metric != self.spec.metric:
            raise ValueError(f"the tuned metric {metric!r} is not one Hydro trials report; they report "
                             f"{self.spec.metric_names()} per member (set TuneSpec.metric, or add {metric!r} "
                             f"to TuneSpec.metrics)")
        if mode and mode != self.spec.mode:
            raise ValueError(f"mode {mode!r} differs from TuneSpec.mode {self.spec.mode!r}")
        self._space = config or self._space
        return self.inner.set_search_properties(self.spec.metric, self.spec.mode, config, **spec)

    def set_max_concurrency(self, max_concurrent: int) -> bool:
        return False  # the limit applies to fused trials, which Tune counts itself

    def suggest(self, trial_id: str) -> dict | None:
        self._ensure_service()
        if self._target_due():
            return self._start_target(trial_id)
        members = self._next_group()
        if members:
            return self._start_trial(trial_id, TrialPlan(SURROGATE, members, self.scale, self.scale > 1,
                                                         self._service_name_or_none(),
                                                         reports_objective=self.transfer_fraction is None))
        if self._exhausted() and (self.transfer_fraction is None or self._target_trial is not None
                                  or not self._running_members()):
            return Searcher.FINISHED
        return None

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        self._observe(trial_id, result)

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        if result:
            self._observe(trial_id, result)
        if trial_id == self._target_trial:
            return
        for member in self._trials.get(trial_id, []):
            if member not in self._done:
                self._finish_member(member, self._last.get(member), error=error or member not in self._last)

    def save(self, checkpoint_path: str) -> None:
        state = {k: v for k, v in self.__dict__.items() if k not in ("spec", "inner", "_service", "_data")}
        if self._service is not None:
            import ray

            state["_stopping"] = ray.get(self._service.get_state.remote())
        with tempfile.TemporaryDirectory() as directory:  # the inner searcher's state, in the same file
            self.inner.save(os.path.join(directory, "inner"))
            with open(os.path.join(directory, "inner"), "rb") as f:
                state["inner_state"] = f.read()
        with open(checkpoint_path, "wb") as f:
            pickle.dump(state, f)

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = pickle.load(f)
        with tempfile.TemporaryDirectory() as directory:
            with open(os.path.join(directory, "inner"), "wb") as f:
                f.write(state.pop("inner_state"))
            self.inner.restore(os.path.join(directory, "inner"))
        self.__dict__.update(state)
        self._service, self._data = None, None
        self._ensure_service()  # restored trials look the service up as soon as they resume

    def __getstate__(self) -> dict:
        # actor handles belong to one Ray session; the data stays with the driver
        return {**self.__dict__, "_service": None, "_data": None}

    # --- results ---------------------------------------------------------------------------------------

    def member_results(self) -> dict[str, dict]:
        """Final result of every finished member (member id -> metrics, epoch, stopped)."""
        return dict(self._done)

    def best_member(self) -> tuple[str, dict] | None:
        """The finished member with the best finite objective, as (member id, config)."""
        metric = self.spec.metric
        scored = [(m, r[metric]) for m, r in self._done.items()
                  if r is not None and isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
        if not scored:
            return None
        best = scored[0]
        for candidate in scored[1:]:
            if self.spec.better(candidate[1], best[1]):
                best = candidate
        return best[0], self._configs[best[0]]

    # --- internals ---------------------------------------------------------------------------------------

    def _service_name_or_none(self) -> str | None:
        return self._service_name if self._stopping is not None else None

    def _ensure_service(self) -> None:
        if self._stopping is not None and self._service is None:
            self._service = start_service(self._service_name, self._stopping)

    def _next_group(self) -> list[tuple[str, dict]]:
        """Draw members until one group is full (or no more can be drawn now); return a group to start."""
        for _ in range(self.max_fusion):
            full = [k for k, b in self._buffers.items() if len(b) >= self._fusion_for(k, b[0][1])]
            if full:
                return self._take(full[0])
            if self._inner_finished or self._drawn >= self.num_samples:
                break
            member = f"m{self._drawn:05d}"
            config = self.inner.suggest(member)
            if config is None:  # the inner searcher cannot suggest now (e.g. its concurrency limit)
                break
            if config == Searcher.FINISHED:
                self._inner_finished = True
                break
            config = _complete(self._space, config)
            self._drawn += 1
            self._configs[member] = config
            self._buffers.setdefault(self.spec.group_key(config), []).append((member, config))
        if not self._buffers:
            return []
        return self._take(max(self._buffers, key=lambda k: len(self._buffers[k])))

    def _take(self, key: tuple) -> list[tuple[str, dict]]:
        buffer = self._buffers[key]
        count = self._fusion_for(key, buffer[0][1])
        taken, rest = buffer[:count], buffer[count:]
        if rest:
            self._buffers[key] = rest
        else:
            del self._buffers[key]
        return taken

    def _fusion_for(self, key: tuple, config: dict) -> int:
        if self.fusion != "auto":
            return min(self.fusion, self.max_fusion)
        if key not in self._fusion_by_key:
            if self._data is None:
                self._data = self.spec.load_data()
            train, _ = self._data
            size = self.spec.batch_size_of(config)
            template = build_member(self.spec.model, config, self.scale)  # one shrink; plan_fusion only times
            plan = plan_fusion(lambda: copy.deepcopy(template),             # steps, initial values do not matter
                               (train[0][:size], train[1][:size]), self.spec.loss,
                               max_members=min(self.max_fusion, self.num_samples), steps=PLAN_STEPS,
                               threads=self.trial_cpus)
            print(f"hydro: plan_fusion for group {key}: F={plan.num_members} ({plan.reason})")
            self._fusion_by_key[key] = plan.num_members
        return self._fusion_by_key[key]

    def _exhausted(self) -> bool:
        """No member is left to draw or waiting in a buffer."""
        return (self._inner_finished or self._drawn >= self.num_samples) and not self._buffers

    def _running_members(self) -> bool:
        return any(m not in self._done for t, ms in self._trials.items() if t != self._target_trial for m in ms)

    def _target_due(self) -> bool:
        if self.transfer_fraction is None or self._target_trial is not None:
            return False
        enough = len(self._done) >= math.ceil(self.transfer_fraction * self.num_samples)
        return (enough or (self._exhausted() and not self._running_members())) and self.best_member() is not None

    def _start_trial(self, trial_id: str, plan: TrialPlan) -> dict:
        self._trials[trial_id] = [m for m, _ in plan.members]
        configs = [c for _, c in plan.members]
        keys = dict.fromkeys(k for c in configs for k in c)
        return {**plan.to_config(), **{k: [c.get(k) for c in configs] for k in keys}}

    def _start_target(self, trial_id: str) -> dict:
        member, config = self.best_member()
        self._target_trial = trial_id
        self._trials[trial_id] = [TARGET_MEMBER_ID]
        source = {"member": member, **{k: v for k, v in self._done[member].items() if k == self.spec.metric}}
        print(f"hydro: training the full-size target with member {member}'s configuration {config}")
        plan = TrialPlan(TARGET, [(TARGET_MEMBER_ID, config)], scale=1, mup=self.scale > 1, source=source)
        return {**plan.to_config(), **config}

    def _observe(self, trial_id: str, result: Mapping) -> None:
        """Feed each member's values in a flattened trial result to the inner searcher."""
        members: dict[str, dict] = {}
        prefix = MEMBERS_KEY + "/"
        for key, value in result.items():
            if key.startswith(prefix):
                member, _, name = key[len(prefix):].partition("/")
                members.setdefault(member, {})[name] = value
        for member, values in members.items():
            if member in self._done or not math.isfinite(values.get("epoch", math.nan)):
                continue  # finished, or a placeholder of a member that left its trial earlier
            if not values.get("done") and values["epoch"] <= self._last.get(member, {}).get("epoch", 0):
                continue  # a retried or restored trial reports epochs again: the first report stands
            self._last[member] = values
            if values.get("done"):
                self._finish_member(member, values)
            else:
                self.inner.on_trial_result(member, values)

    def _finish_member(self, member: str, result: dict | None, error: bool = False) -> None:
        self._done[member] = result
        self.inner.on_trial_complete(member, result=result, error=error)


def _complete(space: Mapping, config: Mapping) -> dict:
    """``config`` with the constant (non-sampled) entries of ``space`` it lacks (some searchers, e.g.
    Optuna, return only the sampled values)."""
    merged = dict(config)
    for key, value in space.items():
        if isinstance(value, Mapping) and "grid_search" not in value:
            merged[key] = _complete(value, config.get(key, {}))
        elif key not in merged and not isinstance(value, (Domain, Mapping)):
            merged[key] = value
    return merged
