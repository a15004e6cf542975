"""Persistent energy state in one SQLite file: power-limit profiles and bandit observations.

Profiles are the raw profiling windows per :class:`ProfileKey` — (model, device, batch size), the device being
the hardware measured (e.g. ``1x nvml:NVIDIA H100 80GB HBM3``, ``1x simulated:analytic-250W``) — so the limit can
be re-picked for any η, and a profile is reused only on the same hardware (never a simulated profile by a real
run, never one GPU model's by another). Profiles of stores written before the device was recorded (table
``profiles``) are left unread: their hardware is unknown, so they are profiled again per device.
Observations are per job name, in order, so a :class:`BatchSizeBandit` is restored by replay.
Safe for several processes (trials) at once: SQLite locking with a busy timeout.

A profiling claim names its owner (host, pid, start token) and holds a lease (s, on the store's wall clock)
that the owner renews while it profiles; a claim whose lease ran out (its owner was SIGKILLed, or its host
died) is taken over by the next run that asks, and so is, at once, a claim whose owner process on this same
host no longer exists.
"""
from __future__ import annotations

import logging
import os
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from schedulers.energy.batch_size import Observation
from schedulers.energy.power_limit import LimitMeasurement

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS device_profiles (
    model TEXT NOT NULL, device TEXT NOT NULL, batch_size INTEGER NOT NULL, power_limit_w INTEGER NOT NULL,
    time_s REAL NOT NULL, energy_j REAL NOT NULL,
    PRIMARY KEY (model, device, batch_size, power_limit_w));
CREATE TABLE IF NOT EXISTS device_profile_leases (
    model TEXT NOT NULL, device TEXT NOT NULL, batch_size INTEGER NOT NULL, host TEXT NOT NULL,
    pid INTEGER NOT NULL, token TEXT NOT NULL, expires_s REAL NOT NULL, PRIMARY KEY (model, device, batch_size));
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, batch_size INTEGER NOT NULL,
    cost REAL NOT NULL, converged INTEGER NOT NULL, trial_id TEXT);
"""


DEFAULT_LEASE_S = 120.0
_KEY = "model = ? AND device = ? AND batch_size = ?"


@dataclass(frozen=True)
class ProfileKey:
    """What a power-limit profile was measured for: the workload ``model``, the ``device`` (the hardware
    measured, see :func:`hydro.energy.trial.device_key`) and the ``batch_size``."""

    model: str
    device: str
    batch_size: int


@dataclass(frozen=True)
class ClaimOwner:
    """Who holds a profiling claim: host name, process id and a token unique to the claiming run."""

    host: str
    pid: int
    token: str

    @classmethod
    def this_process(cls) -> ClaimOwner:
        """A new owner for a run in this process (a fresh token, so a reused pid is another owner)."""
        return cls(socket.gethostname(), os.getpid(), uuid.uuid4().hex)

    def gone(self) -> bool:
        """True if the owner is a process of this host that no longer exists (a live reused pid counts as alive)."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # exists, another user's
            return False
        return False


class EnergyStore:
    """State file at ``path`` (created with its parent directory if missing); ``clock`` (s, default
    ``time.time``) times the claims' leases and must agree across the hosts sharing the file."""

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)
        self._warn_unkeyed_profiles()

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        try:
            with db:  # commits, or rolls back on error
                yield db
        finally:
            db.close()

    # ------------------------------------------------------------ profiles
    def claim_profile(self, key: ProfileKey, owner: ClaimOwner, lease_s: float = DEFAULT_LEASE_S) -> bool:
        """Reserve profiling of ``key`` for ``owner`` for ``lease_s`` seconds. False if it is profiled already or
        another live owner's lease has not run out; an expired claim, or one whose owner process on this host is
        gone, is taken over."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")  # read and write the claim in one locked transaction
            if db.execute(f"SELECT 1 FROM device_profiles WHERE {_KEY} LIMIT 1", _args(key)).fetchone():
                return False
            row = db.execute(f"SELECT host, pid, token, expires_s FROM device_profile_leases WHERE {_KEY}",
                             _args(key)).fetchone()
            now = self.clock()
            if row is not None and row[2] != owner.token and row[3] > now and not ClaimOwner(*row[:3]).gone():
                return False
            db.execute("INSERT OR REPLACE INTO device_profile_leases VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (*_args(key), owner.host, owner.pid, owner.token, now + lease_s))
            return True

    def renew_claim(self, key: ProfileKey, owner: ClaimOwner, lease_s: float = DEFAULT_LEASE_S) -> bool:
        """Extend ``owner``'s lease to ``lease_s`` from now; False if the claim is no longer its own."""
        with self._connect() as db:
            cur = db.execute(f"UPDATE device_profile_leases SET expires_s = ? WHERE {_KEY} AND token = ?",
                             (self.clock() + lease_s, *_args(key), owner.token))
            return cur.rowcount == 1

    def claim_holder(self, key: ProfileKey) -> tuple[ClaimOwner, float] | None:
        """The owner of the claim on ``key`` and when its lease ends (store clock, s), if any."""
        with self._connect() as db:
            row = db.execute(f"SELECT host, pid, token, expires_s FROM device_profile_leases WHERE {_KEY}",
                             _args(key)).fetchone()
        return None if row is None else (ClaimOwner(*row[:3]), row[3])

    def release_claim(self, key: ProfileKey, owner: ClaimOwner) -> None:
        """Give up ``owner``'s claim (profiling finished or was interrupted); another owner's claim stays."""
        with self._connect() as db:
            db.execute(f"DELETE FROM device_profile_leases WHERE {_KEY} AND token = ?", (*_args(key), owner.token))

    def save_profile(self, key: ProfileKey, windows: Iterable[LimitMeasurement]) -> bool:
        """Store the profiling windows of ``key`` unless a profile is stored already (the first complete profile
        wins, whole); True if these windows were stored."""
        rows = [(*_args(key), w.power_limit_w, w.time_s, w.energy_j) for w in windows]
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            if db.execute(f"SELECT 1 FROM device_profiles WHERE {_KEY} LIMIT 1", _args(key)).fetchone():
                return False
            db.executemany("INSERT INTO device_profiles VALUES (?, ?, ?, ?, ?, ?)", rows)
            return True

    def load_profile(self, key: ProfileKey) -> list[LimitMeasurement]:
        """Stored windows of ``key``, highest limit first; empty if never profiled on that device."""
        with self._connect() as db:
            rows = db.execute(f"SELECT power_limit_w, time_s, energy_j FROM device_profiles WHERE {_KEY} "
                              "ORDER BY power_limit_w DESC", _args(key)).fetchall()
        return [LimitMeasurement(*r) for r in rows]

    def _warn_unkeyed_profiles(self) -> None:
        """Log, once per store opened, that profiles stored without their device (an older store) are not reused."""
        with self._connect() as db:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'profiles'").fetchone():
                return
            count = db.execute("SELECT COUNT(DISTINCT model || '/' || batch_size) FROM profiles").fetchone()[0]
        if count:
            logger.warning("energy store %s: %d power-limit profiles were stored without the device they were "
                           "measured on; they are not reused (each is profiled again on its device)", self.path,
                           count)

    # ------------------------------------------------------------ observations
    def add_observation(self, job: str, obs: Observation, trial_id: str | None = None) -> None:
        """Append one finished run of ``job``."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO observations (job, batch_size, cost, converged, trial_id) VALUES (?, ?, ?, ?, ?)",
                (job, obs.batch_size, obs.cost, int(obs.converged), trial_id),
            )

    def observations(self, job: str) -> list[Observation]:
        """All runs of ``job`` in the order they finished."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT batch_size, cost, converged FROM observations WHERE job = ? ORDER BY id", (job,)
            ).fetchall()
        return [Observation(b, c, bool(v)) for b, c, v in rows]


def _args(key: ProfileKey) -> tuple[str, str, int]:
    return key.model, key.device, int(key.batch_size)
