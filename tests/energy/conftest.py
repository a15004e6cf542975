"""Shared fixtures: the Zeus traces, located as the code locates them (``../shared`` or $HYDRO_ZEUS_TRACES)."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedulers.energy.traces import TraceError, traces_dir


@pytest.fixture(scope="session")
def zeus_traces() -> Path:
    try:
        return traces_dir()
    except TraceError as err:
        pytest.skip(str(err))
