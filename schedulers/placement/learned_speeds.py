"""GPU types' speeds as a placement learns them: a prior per type, corrected by the step times trials measure.

Each type's predicted step is ``correction[g] x prior[g].step_seconds(work)``, with ``correction`` the rule of
:class:`~schedulers.placement.predicted_finish.PredictedFinish` (the median ratio of the step times measured on
``g`` to the prior's prediction for them; a type not measured yet takes the median over all measurements, else 1).
Because a step is ``overhead + work / rate``, the corrected type is again a
:class:`~schedulers.placement.cluster.GpuType`: rate ``rate / c`` and overhead ``overhead x c``, which any placement
policy takes as it takes known speeds.
"""
from __future__ import annotations

from collections.abc import Mapping

from schedulers.placement.cluster import GpuType
from schedulers.placement.predicted_finish import PredictedFinish


class LearnedSpeeds:
    """Speeds per GPU type learned from trials' measured steps, starting from ``prior`` on a cluster of
    ``counts[type]`` GPUs (the types of both must match)."""

    def __init__(self, prior: Mapping[str, GpuType], counts: Mapping[str, int]) -> None:
        self.prior = dict(prior)
        self._finish = PredictedFinish(self.prior, dict(counts))
        self._types: dict[str, GpuType] | None = None

    def started(self, key: str, gpu: str, work_per_member: float, members: int, steps: int) -> None:
        """Trial ``key`` (``members`` members of ``work_per_member`` reference seconds per step, ``steps`` steps
        planned) started on a GPU of type ``gpu``."""
        self._finish.choose(key, work_per_member, members, max(1, steps))
        self._finish.move(key, gpu)

    def measured(self, key: str, done: int, members: int, seconds_per_step: float) -> None:
        """Trial ``key`` has done ``done`` steps, measured at ``seconds_per_step`` by the members it had since the
        last call, and has ``members`` members from now on."""
        self._finish.progress(key, done, members, seconds_per_step)
        self._types = None

    def ended(self, key: str) -> None:
        """Trial ``key`` gave its GPU back."""
        self._finish.end(key)

    def correction(self, gpu: str) -> float:
        """Measured ÷ prior step time on ``gpu`` (:meth:`PredictedFinish.correction`)."""
        return self._finish.correction(gpu)

    def types(self) -> dict[str, GpuType]:
        """Per type, its speed as learned so far (the prior times its correction)."""
        if self._types is None:
            self._types = {}
            for name, gpu in self.prior.items():
                c = self.correction(name)
                self._types[name] = GpuType(name, gpu.rate / c, gpu.overhead_s * c,
                                            f"learned: prior x measured correction {c:.3g}")
        return self._types
