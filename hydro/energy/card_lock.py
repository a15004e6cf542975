"""Exclusive control of a GPU card's power limit among the processes of one host.

A card has one power limit. Two processes profiling it at once would measure each other's limits, and one
that starts while another holds a limit would save that limit as the card's own and later "restore" it. So a
process controls a card's limit only while it holds the card's lock: an ``fcntl.flock`` on
``<directory>/<card UUID>.lock`` (default directory ``$HYDRO_POWER_LOCK_DIR``, else ``hydro-power-locks`` in the
system's temporary directory). The kernel drops the lock when its holder exits, even when SIGKILLed.
"""
from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from hydro.energy.device import EnergyError

LOCK_DIR_ENV = "HYDRO_POWER_LOCK_DIR"
DEFAULT_WAIT_S = 10.0


class CardBusy(EnergyError):
    """Another process controls the card's power limit and did not let go within the wait."""


def lock_directory() -> Path:
    """Where the per-card lock files live: ``$HYDRO_POWER_LOCK_DIR`` or ``<tmp>/hydro-power-locks``."""
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "hydro-power-locks")


class CardLocks:
    """The locks of ``card_ids`` (duplicates count once; taken in sorted order, so two processes wanting
    overlapping cards cannot deadlock). :meth:`acquire` waits at most ``wait_s`` seconds in all."""

    def __init__(self, card_ids: Iterable[str], *, wait_s: float = DEFAULT_WAIT_S, directory: Path | None = None,
                 poll_s: float = 0.05) -> None:
        if wait_s < 0:
            raise ValueError(f"hydro.energy: the card lock wait must be >= 0 s, got {wait_s}")
        self.card_ids = sorted(set(card_ids))
        self.wait_s, self.poll_s = wait_s, poll_s
        self.directory = directory or lock_directory()
        self._held: list[int] = []  # open file descriptors holding a lock

    def path(self, card_id: str) -> Path:
        return self.directory / f"{card_id}.lock"

    def acquire(self) -> None:
        """Take every card's lock, waiting up to ``wait_s`` for holders to let go.

        Raises:
            CardBusy: a card is still locked after the wait (naming the holder's host and pid and the lock
                file); the locks taken so far are released.
        """
        if self._held:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + self.wait_s
        for card in self.card_ids:
            fd = os.open(self.path(card), os.O_RDWR | os.O_CREAT, 0o666)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
                        os.close(fd)
                        self.release()
                        raise CardBusy(
                            f"hydro.energy: GPU {card}'s power limit is controlled by another process ({holder}; "
                            f"lock {self.path(card)}) and was not let go within {self.wait_s:g} s (one process "
                            f"controls a card's power limit at a time)") from None
                    time.sleep(self.poll_s)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"host {socket.gethostname()}, pid {os.getpid()}".encode(), 0)
            self._held.append(fd)

    def release(self) -> None:
        """Let go of every lock held (closing the file drops its lock)."""
        held, self._held = self._held, []
        for fd in held:
            os.close(fd)
