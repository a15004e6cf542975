"""Persistent energy state in one SQLite file: power-limit profiles and bandit observations.

Profiles are the raw profiling windows per (model, batch size), so the limit can be re-picked for
any η. Observations are per job name, in order, so a :class:`BatchSizeBandit` is restored by replay.
Safe for several processes (trials) at once: SQLite locking with a busy timeout.
"""
from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from schedulers.energy.batch_size import Observation
from schedulers.energy.power_limit import LimitMeasurement

_SCHEMA = """
CREATE TABLE IF NOT EXISTS profiles (
    model TEXT NOT NULL, batch_size INTEGER NOT NULL, power_limit_w INTEGER NOT NULL,
    time_s REAL NOT NULL, energy_j REAL NOT NULL,
    PRIMARY KEY (model, batch_size, power_limit_w));
CREATE TABLE IF NOT EXISTS profile_claims (
    model TEXT NOT NULL, batch_size INTEGER NOT NULL, PRIMARY KEY (model, batch_size));
CREATE TABLE IF NOT EXISTS observations (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job TEXT NOT NULL, batch_size INTEGER NOT NULL,
    cost REAL NOT NULL, converged INTEGER NOT NULL, trial_id TEXT);
"""


class EnergyStore:
    """State file at ``path`` (created with its parent directory if missing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0)
        try:
            with db:  # commits, or rolls back on error
                yield db
        finally:
            db.close()

    # ------------------------------------------------------------ profiles
    def claim_profile(self, model: str, batch_size: int) -> bool:
        """Reserve profiling of (model, batch size); False if another run holds it or it is done."""
        with self._connect() as db:
            cur = db.execute("INSERT OR IGNORE INTO profile_claims VALUES (?, ?)", (model, batch_size))
            return cur.rowcount == 1

    def release_claim(self, model: str, batch_size: int) -> None:
        """Give up a claim without a profile (profiling was interrupted)."""
        with self._connect() as db:
            db.execute("DELETE FROM profile_claims WHERE model = ? AND batch_size = ?", (model, batch_size))

    def save_profile(self, model: str, batch_size: int, windows: Iterable[LimitMeasurement]) -> None:
        """Store the profiling windows of (model, batch size); the first complete profile wins."""
        rows = [(model, batch_size, w.power_limit_w, w.time_s, w.energy_j) for w in windows]
        with self._connect() as db:
            db.executemany("INSERT OR IGNORE INTO profiles VALUES (?, ?, ?, ?, ?)", rows)

    def load_profile(self, model: str, batch_size: int) -> list[LimitMeasurement]:
        """Stored windows of (model, batch size), highest limit first; empty if never profiled."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT power_limit_w, time_s, energy_j FROM profiles WHERE model = ? AND batch_size = ? "
                "ORDER BY power_limit_w DESC",
                (model, batch_size),
            ).fetchall()
        return [LimitMeasurement(*r) for r in rows]

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
