"""The per-member stopping service shared by all fused trials of a run: a named Ray actor around
``schedulers.member_stopping.MemberStopping``. The searcher (driver) owns it; trials look it up by name."""
from __future__ import annotations

import time
from collections.abc import Mapping

import ray

from schedulers.member_stopping import MemberStopping


@ray.remote(num_cpus=0, max_restarts=0)
class MemberDecisions:
    """Actor holding one ``MemberStopping``; ``get_state``/``set_state`` let the searcher checkpoint it."""

    def __init__(self, stopping: MemberStopping) -> None:
        self.stopping = stopping

    def decide(self, epoch: int, values: Mapping[str, float], final: bool) -> list[str]:
        """The members of ``values`` (member id -> objective after ``epoch``) that stop now."""
        return [m for m, v in values.items() if self.stopping.decide(m, epoch, v, final=final)]

    def get_state(self) -> MemberStopping:
        return self.stopping

    def set_state(self, stopping: MemberStopping) -> None:
        self.stopping = stopping


def start_service(name: str, stopping: MemberStopping):
    """Create the named actor (or reuse the live one of that name) holding ``stopping``."""
    actor = MemberDecisions.options(name=name, get_if_exists=True).remote(stopping)
    ray.get(actor.set_state.remote(stopping))
    return actor


def lookup_service(name: str, timeout_s: float = 60.0):
    """The actor named ``name``, waiting up to ``timeout_s`` for the driver to (re)create it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ray.get_actor(name)
        except ValueError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Hydro member-decision service {name!r} is not running; trials of a "
                                   f"HydroSearcher run must be started by Ray Tune with that searcher") from None
            time.sleep(0.5)
