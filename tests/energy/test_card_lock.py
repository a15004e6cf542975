"""One process controls a card's power limit at a time: a per-card lock file (by UUID), a bounded wait with a
message naming the holder, control taken up once the holder lets go (or dies). Two real processes on mocked
NVML."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pynvml as real
import pytest

from hydro.energy import power_limit
from hydro.energy.card_lock import CardBusy, CardLocks
from hydro.energy.nvml import nvml_devices
from hydro.energy.power_limit import PowerLimitWarning
from hydro.energy.trial import TrialEnergy
from schedulers.energy.store import EnergyStore
from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml

REPO = Path(__file__).resolve().parents[2]
UUID = "GPU-aaaa"

# Another process profiling the same card (its own mocked NVML, the same UUID) until told to stop on stdin.
HOLDER = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(REPO)!r})
    import pynvml as real
    from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml
    sys.modules["pynvml"] = make_fake_pynvml([FakeGPU({UUID!r}, real.NVML_DEVICE_ARCH_VOLTA)])
    from hydro.energy.nvml import nvml_devices
    from hydro.energy.power_limit import PowerLimitProfiler
    profiler = PowerLimitProfiler(nvml_devices(env={{}}), warmup_steps=0, window_steps=1)
    print("holding", flush=True)
    sys.stdin.readline()
    profiler.close()
    print("released", flush=True)
    sys.stdin.readline()
""")


def _holder() -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "holding"
    return child


def _tell(child: subprocess.Popen, expect: str) -> None:
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline().strip() == expect


def test_a_second_process_waits_boundedly_then_takes_control_when_the_first_lets_go(tmp_path, monkeypatch):
    gpu = FakeGPU(UUID, real.NVML_DEVICE_ARCH_VOLTA)
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml([gpu]))
    waits = []  # the wait of each try to take the card

    def recording(card_ids, wait_s):
        waits.append(wait_s)
        return CardLocks(card_ids, wait_s=wait_s)

    monkeypatch.setattr(power_limit, "CardLocks", recording)
    child = _holder()
    try:
        energy = TrialEnergy(nvml_devices(env={}), store=EnergyStore(tmp_path / "e.db"), model="m", batch_size=32,
                             warmup_steps=0, window_steps=1, poll_steps=2, lock_wait_s=0.3)
        with pytest.warns(PowerLimitWarning, match=rf"GPU {UUID}'s power limit is controlled by another process "
                                                   rf"\(host .*, pid {child.pid}; lock .*{UUID}\.lock\)"):
            energy.__enter__()
        assert energy.profiler is None and gpu.set_history == []  # measures only; nothing set
        assert energy.store.claim_holder(energy.key) is None  # the profile claim was given back
        energy.on_step()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            energy.on_step()  # a poll while the card is still held: no second wait, no second warning
        assert energy.profiler is None and "tries again every 2 steps" in energy.card_busy and waits == [0.3, 0.0]
        _tell(child, "released")
        energy.on_step()
        energy.on_step()  # the next poll: the lock is free now
        assert energy.profiler is not None and energy.profiler.profiling and gpu.set_history == [250_000]
        assert energy.card_busy is None and waits == [0.3, 0.0, 0.0]
        with pytest.raises(CardBusy, match=f"pid {os.getpid()}"):  # now this process holds it
            CardLocks([UUID], wait_s=0.1).acquire()
        energy.__exit__(None, None, None)
        free = CardLocks([UUID], wait_s=0)
        free.acquire()  # let go on exit
        free.release()
    finally:
        child.kill()
        child.wait()


def test_the_lock_of_a_killed_holder_is_free_at_once():
    child = _holder()
    with pytest.raises(CardBusy, match="was not let go within 0.1 s"):
        CardLocks([UUID], wait_s=0.1).acquire()
    child.send_signal(signal.SIGKILL)
    child.wait()
    locks = CardLocks([UUID, UUID], wait_s=0)  # one card named twice (two MIG instances): one lock
    locks.acquire()
    assert locks.card_ids == [UUID]
    locks.release()
