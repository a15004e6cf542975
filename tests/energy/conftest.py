"""Shared fixtures: per-test card-lock directory; the Zeus traces, located as the code locates them (``../shared`` or $HYDRO_ZEUS_TRACES)."""
from __future__ import annotations

from pathlib import Path

import pytest

from hydro.energy.card_lock import LOCK_DIR_ENV
from schedulers.energy.traces import TraceError, traces_dir


@pytest.fixture(autouse=True)
def _private_card_locks(tmp_path, monkeypatch):
    """Per-card power-limit locks in the test's own directory (fake GPUs share UUIDs across tests and runs)."""
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "card-locks"))


@pytest.fixture(scope="session")
def zeus_traces() -> Path:
    try:
        return traces_dir()
    except TraceError as err:
        pytest.skip(str(err))
