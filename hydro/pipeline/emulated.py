"""Emulated neighbours of one real pipeline stage, so that a single device has the bubbles of a whole pipeline.

:class:`EmulatedNeighbours` is a :class:`~hydro.pipeline.stage.Transport` for stage ``stage`` of a 1F1B pipeline of
``num_stages`` stages whose other stages do not exist: a receive is answered when the emulated neighbour would
have sent its activation or gradient, by playing the 1F1B dependencies (as :func:`~hydro.pipeline.schedule.simulate`
does) with the other stages' operation times and the real stage's own sends as they happened on its device. The
real stage therefore idles exactly where the full pipeline would make it idle, on its real device, and its
bubbles are real: on a GPU its stream has nothing queued until the answer comes (the host issues the copy of the
answer only then). Each iteration starts all stages together (as after the optimizer step's synchronisation).

The answers' values are fixed tensors (activations ~ N(0, 1), gradients ~ 1e-3 N(0, 1)): the stage's training is
not the full model's, its timing is.
"""
from __future__ import annotations

import time

import torch
from torch import Tensor

from .schedule import Op, one_f_one_b
from .timing import DeviceTimer, Mark


class _Done:
    """A finished send (the emulated neighbour takes it at once)."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Answer:
    """A posted receive: ``wait()`` returns once the emulated neighbour's message is due and copied in."""

    def __init__(self, neighbours: EmulatedNeighbours, buffer: Tensor, message: tuple[int, str, int]) -> None:
        self.neighbours, self.buffer, self.message = neighbours, buffer, message
        self.done = False

    def wait(self) -> bool:
        if not self.done:
            due = self.neighbours.due(self.message)
            time.sleep(max(0.0, due - time.time()))
            self.buffer.copy_(self.neighbours.payload(self.message[1], self.buffer))
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done


class EmulatedNeighbours:
    """The other stages of a ``num_stages``-stage 1F1B pipeline of ``microbatches``, around real stage ``stage``
    on ``device``. ``forward_s``/``backward_s``: each emulated stage's operation times (seconds; set them
    with :meth:`set_times`, e.g. to the real stage's profiled ones: a balanced pipeline); ``comm_s``: the
    transfer time of a message. Until times are set the neighbours answer at once (no bubbles)."""

    def __init__(self, stage: int, num_stages: int, microbatches: int, device: torch.device | str = "cpu",
                 comm_s: float = 0.0) -> None:
        if not 0 <= stage < num_stages or num_stages < 2:
            raise ValueError(f"bubbles: EmulatedNeighbours emulates the other stages of a pipeline of >= 2 stages; "
                             f"got stage {stage} of {num_stages}")
        self.stage, self.num_stages, self.timer, self.comm_s = stage, num_stages, DeviceTimer(device), comm_s
        self.schedule = one_f_one_b(num_stages, microbatches)
        self.forward_s, self.backward_s = [0.0] * num_stages, [0.0] * num_stages
        self._payloads: dict[tuple[str, tuple, torch.dtype], Tensor] = {}
        self.begin_iteration()

    def set_times(self, forward_s: float, backward_s: float) -> None:
        """Every emulated stage's forward and backward time (seconds)."""
        self.forward_s, self.backward_s = [forward_s] * self.num_stages, [backward_s] * self.num_stages

    def begin_iteration(self) -> None:
        self.timer.anchor()  # (the stage has just synchronised at its optimizer step)
        self.origin = time.time()
        self._sent: dict[tuple[str, int], Mark] = {}  # the real stage's sends: (kind, microbatch) -> device mark
        self._send_order = {peer: [op for op in self.schedule[self.stage] if op.kind == kind]
                            for peer, kind in ((self.stage + 1, "F"), (self.stage - 1, "B"))}
        self._receive_order = {peer: [op for op in self.schedule[self.stage] if op.kind == kind]
                               for peer, kind in ((self.stage - 1, "F"), (self.stage + 1, "B"))}

    def isend(self, tensor: Tensor, peer: int) -> _Done:
        op: Op = self._send_order[peer].pop(0)
        self._sent[(op.kind, op.microbatch)] = self.timer.mark()  # when the device has produced it
        return _Done()

    def irecv(self, buffer: Tensor, peer: int) -> _Answer:
        op: Op = self._receive_order[peer].pop(0)
        return _Answer(self, buffer, (peer, op.kind, op.microbatch))

    def share(self, values: Tensor) -> list[Tensor]:
        """Every stage's values are the real stage's (a balanced pipeline); also sets the emulated stages' times
        to them (``values``: forward and backward seconds)."""
        self.set_times(float(values[0]), float(values[1]))
        return [values.clone() for _ in range(self.num_stages)]

    def payload(self, kind: str, like: Tensor) -> Tensor:
        key = (kind, tuple(like.shape), like.dtype)
        if key not in self._payloads:
            g = torch.Generator().manual_seed(1 if kind == "F" else 2)
            value = torch.randn(like.shape, generator=g, dtype=like.dtype)
            self._payloads[key] = (value if kind == "F" else 1e-3 * value).to(like.device)
        return self._payloads[key]

    def due(self, message: tuple[int, str, int]) -> float:
        """When (``time.time()`` seconds) the emulated ``(stage, kind, microbatch)`` message arrives: the 1F1B
        dependencies played from the iteration's start with the real stage's sends so far (each waited for on
        the device: the real stage asks in a bubble, when its own work is done)."""
        real = {}
        for (kind, microbatch), mark in self._sent.items():
            self.timer.wait(mark)
            real[(self.stage, kind, microbatch)] = self.timer.wall(mark) - self.origin
        done = self._play(real)
        if message not in done:
            raise RuntimeError(f"bubbles: emulated stage {message[0]} cannot send {message[1]}{message[2]} before the "
                               f"real stage {self.stage} sends more: the receives are out of 1F1B order")
        return self.origin + done[message] + self.comm_s

    def _play(self, real: dict[tuple[int, str, int], float]) -> dict[tuple[int, str, int], float]:
        """End times (s from the iteration's start) of every emulated operation that can run given ``real``."""
        done = dict(real)
        position, free = [0] * self.num_stages, [0.0] * self.num_stages
        progressed = True
        while progressed:
            progressed = False
            for s in range(self.num_stages):
                if s == self.stage or position[s] == len(self.schedule[s]):
                    continue
                op = self.schedule[s][position[s]]
                dependency = ((s - 1, "F", op.microbatch) if op.kind == "F" and s > 0 else
                              (s + 1, "B", op.microbatch) if op.kind == "B" and s < self.num_stages - 1 else None)
                if dependency is not None and dependency not in done:
                    continue
                arrival = 0.0 if dependency is None else done[dependency] + self.comm_s
                start = max(free[s], arrival)
                free[s] = start + (self.forward_s[s] if op.kind == "F" else self.backward_s[s])
                done[(s, op.kind, op.microbatch)] = free[s]
                position[s] += 1
                progressed = True
        return done
