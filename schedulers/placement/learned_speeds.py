"""GPU types' speeds as a placement learns them: a prior per type, corrected by the step times trials measure.

Each type's predicted step is ``c_o[g] x prior[g].overhead_s + c_w[g] x work / prior[g].rate``, with ``(c_o,
c_w)`` the rule of :class:`~schedulers.placement.predicted_finish.PredictedFinish` (fitted to the step times
measured on ``g``; before two mixes of overhead and work were measured there, both the median ratio of the measured
step times to the prior's). Because a step is ``overhead + work / rate``, the corrected type is again a
:class:`~schedulers.placement.cluster.GpuType`: rate ``rate / c_w`` and overhead ``overhead x c_o``, which any
placement policy takes as it takes known speeds.
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
                c_o, c_w = self._finish.corrections(name)
                self._types[name] = GpuType(name, gpu.rate / c_w, gpu.overhead_s * c_o,
                                            f"learned: prior x measured corrections {c_o:.3g} (overhead), "
                                            f"{c_w:.3g} (work)")
        return self._types
