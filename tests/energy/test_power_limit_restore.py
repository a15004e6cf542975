"""Power limits on mocked NVML: restore exactly the limit found (per GPU), never raise above it, restore on
SIGTERM/SIGINT in a plain process, sync before reading windows, and leases on profiling claims."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pynvml as real
import pytest

from hydro.energy import exit_guard
from hydro.energy.monitor import EnergyMonitor
from hydro.energy.nvml import nvml_devices
from hydro.energy.power_limit import PowerLimitProfiler, PowerLimitWarning
from schedulers.energy.store import ClaimOwner, EnergyStore, ProfileKey
from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml

VOLTA = real.NVML_DEVICE_ARCH_VOLTA
REPO = Path(__file__).resolve().parents[2]
KEY = ProfileKey("m", "1x nvml:NVIDIA H100 80GB HBM3", 32)


def _gpus(monkeypatch, *gpus: FakeGPU):
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(list(gpus)))
    return nvml_devices(env={})


def test_admin_cap_is_the_ceiling_and_is_restored_exactly(monkeypatch):
    gpu = FakeGPU("GPU-aaaa", VOLTA)  # a 250 W card ...
    gpu.limit_mw = 200_000  # ... that an administrator capped at 200 W
    (dev,) = _gpus(monkeypatch, gpu)
    with PowerLimitProfiler([dev], warmup_steps=0, window_steps=1) as prof:
        assert prof.optimizer.power_limits == [200, 175, 150, 125, 100]  # never above the cap
        assert prof.saved_limits_w == [200.0]
        for _ in range(3):
            gpu.energy_mj += 1000
            prof.on_step()
        assert gpu.limit_mw < 200_000
    assert gpu.limit_mw == 200_000  # the cap, not the card's 250 W maximum
    assert max(gpu.set_history) == 200_000


def test_ceiling_is_the_lowest_current_limit_unless_overridden(monkeypatch):
    a, b = FakeGPU("GPU-aaaa", VOLTA), FakeGPU("GPU-bbbb", VOLTA)
    b.limit_mw = 225_000
    devs = _gpus(monkeypatch, a, b)
    with PowerLimitProfiler(devs, warmup_steps=0, window_steps=1) as prof:
        assert prof.optimizer.power_limits[0] == 225
    with PowerLimitProfiler(devs, warmup_steps=0, window_steps=1, ceiling_w=250) as prof:
        assert prof.optimizer.power_limits[0] == 250  # explicit override
    assert (a.limit_mw, b.limit_mw) == (250_000, 225_000)
    with pytest.raises(ValueError, match="known_limit 250 W is above the ceiling 225 W"):
        PowerLimitProfiler(devs, known_limit=250)
    with pytest.raises(ValueError, match="ceiling 50.0 W is below the lowest settable limit 100.0 W"):
        PowerLimitProfiler(devs, ceiling_w=50)


@pytest.mark.parametrize("denied", [0, 1])
def test_one_of_two_gpus_denied_is_handled_per_gpu(monkeypatch, denied):
    gpus = [FakeGPU("GPU-aaaa", VOLTA), FakeGPU("GPU-bbbb", VOLTA)]
    gpus[0].limit_mw = 200_000  # capped
    gpus[denied].deny_set = True
    devs = _gpus(monkeypatch, *gpus)
    with pytest.warns(PowerLimitWarning, match=f"cannot set the power limit of gpu{denied} .PermissionDenied"):
        prof = PowerLimitProfiler(devs, known_limit=150)
    assert not prof.controllable
    assert [g.limit_mw for g in gpus] == [200_000, 250_000]  # each GPU back at (or still at) its own limit
    if denied == 1:  # gpu0 had been set before gpu1 refused: put back to its cap, not to 250 W
        assert gpus[0].set_history == [150_000, 200_000]
    assert gpus[denied].set_history == []
    prof.close()


def test_not_supported_is_caught_and_typed(monkeypatch):
    gpu = FakeGPU("GPU-aaaa", VOLTA)
    fake = make_fake_pynvml([gpu])

    def unsupported(handle, mw):
        raise fake.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)

    fake.nvmlDeviceSetPowerManagementLimit = unsupported
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (dev,) = nvml_devices(env={})
    with pytest.warns(PowerLimitWarning, match="NotSupported: gpu0: nvmlDeviceSetPowerManagementLimit: not supported"):
        with PowerLimitProfiler([dev], warmup_steps=0, window_steps=1) as prof:
            prof.on_step()
    assert not prof.controllable and gpu.limit_mw == 250_000


def test_windows_synchronise_cuda_before_reading(monkeypatch):
    """Energy the GPU has queued (not yet run) lands only on synchronize: a window must include it."""
    gpu = FakeGPU("GPU-aaaa", VOLTA)
    (dev,) = _gpus(monkeypatch, gpu)
    queued = []

    def synchronize(index):
        assert index == 0
        gpu.energy_mj += sum(queued)
        queued.clear()

    fake_torch = types.SimpleNamespace(cuda=types.SimpleNamespace(is_initialized=lambda: True, synchronize=synchronize))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    monitor = EnergyMonitor([dev])
    queued.append(500)  # work queued before the window belongs before it
    monitor.begin_window("w")
    queued.append(3000)
    assert monitor.end_window("w").energy_j == {"gpu0": 3.0}


def _default_signals() -> None:
    """SIGINT's default action, as in a terminal: a shell without job control starts background jobs (e.g. a suite
    run with ``&``) with SIGINT ignored, and the guard rightly leaves an ignored signal ignored."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def test_exit_guard_chains_the_previous_handler_and_uninstalls():
    calls, chained = [], []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: chained.append(signum))
    sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        exit_guard.guard(lambda: calls.append("restore"))
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == ["restore"] and chained == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGTERM) is not exit_guard._handler  # uninstalled after it ran
        cb = lambda: calls.append("never")  # noqa: E731
        exit_guard.guard(cb)
        assert signal.getsignal(signal.SIGINT) is exit_guard._handler
        exit_guard.release(cb)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler and calls == ["restore"]
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # e.g. started with nohup: stays ignored
        exit_guard.guard(cb)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        exit_guard.release(cb)
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, sigint)


_CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    import pynvml as real
    from tests.energy.fake_nvml import FakeGPU, make_fake_pynvml
    gpu = FakeGPU("GPU-aaaa", real.NVML_DEVICE_ARCH_VOLTA)
    gpu.limit_mw = 200_000
    fake = make_fake_pynvml([gpu])
    set_limit = fake.nvmlDeviceSetPowerManagementLimit
    def logged(handle, mw):
        set_limit(handle, mw)
        print("set", mw, flush=True)
    fake.nvmlDeviceSetPowerManagementLimit = logged
    sys.modules["pynvml"] = fake
    from hydro.energy.nvml import nvml_devices
    from hydro.energy.power_limit import PowerLimitProfiler
    prof = PowerLimitProfiler(nvml_devices(env={{}}), known_limit=150)
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_in_a_plain_process_restores_the_limit_found(signum):
    child = subprocess.Popen([sys.executable, "-c", _CHILD.format(repo=str(REPO))], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, preexec_fn=_default_signals)
    try:
        assert child.stdout.readline().split() == ["set", "150000"]
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signum)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert out.split() == ["set", "200000"], err  # the admin cap, once
    if signum == signal.SIGTERM:
        assert child.returncode == -signal.SIGTERM  # still ends by the signal (default action chained)
    else:
        assert "KeyboardInterrupt" in err  # Python's SIGINT handler chained


def test_expired_claim_of_a_killed_owner_is_taken_over(tmp_path):
    now = [1000.0]
    store = EnergyStore(tmp_path / "s.db", clock=lambda: now[0])
    first, second = ClaimOwner("h1", 11, "t1"), ClaimOwner("h2", 22, "t2")
    assert store.claim_profile(KEY, first, lease_s=60)
    assert store.claim_holder(KEY) == (first, 1060.0)
    assert not store.claim_profile(KEY, second, lease_s=60)
    now[0] = 1050.0
    assert store.renew_claim(KEY, first, lease_s=60)  # alive: lease now ends at 1110
    now[0] = 1100.0
    assert not store.claim_profile(KEY, second, lease_s=60)
    now[0] = 1111.0  # the first owner stopped renewing (SIGKILLed)
    assert store.claim_profile(KEY, second, lease_s=60)
    assert store.claim_holder(KEY)[0] == second
    assert not store.renew_claim(KEY, first)  # the old owner learns it lost the claim
    store.release_claim(KEY, first)  # and cannot release someone else's claim
    assert store.claim_holder(KEY)[0] == second


def test_sigkilled_process_claim_is_taken_over(tmp_path):
    """On the same host at once (the owner's pid is gone); from another host once the lease has run out."""
    db = tmp_path / "s.db"
    code = (f"import sys, time; sys.path.insert(0, {str(REPO)!r})\n"
            "from schedulers.energy.store import ClaimOwner, EnergyStore, ProfileKey\n"
            f"KEY = ProfileKey({KEY.model!r}, {KEY.device!r}, {KEY.batch_size})\n"
            f"print(EnergyStore({str(db)!r}).claim_profile(KEY, ClaimOwner.this_process(), lease_s=30), flush=True)\n"
            "time.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "True"
        holder, _ = EnergyStore(db).claim_holder(KEY)
        assert holder.pid == child.pid and holder.host == socket.gethostname() and not holder.gone()
        assert not EnergyStore(db).claim_profile(KEY, ClaimOwner.this_process())  # alive, within its lease
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        child.kill()
    assert holder.gone()
    remote = ClaimOwner("other-host", holder.pid, holder.token)  # the same claim, seen as another host's
    store = EnergyStore(db)
    with store._connect() as conn:
        conn.execute("UPDATE device_profile_leases SET host = ?", (remote.host,))
    assert not store.claim_profile(KEY, ClaimOwner.this_process())  # cannot tell: waits for the lease
    later = EnergyStore(db, clock=lambda: time.time() + 31)
    assert later.claim_profile(KEY, ClaimOwner.this_process())  # taken over after it
    with store._connect() as conn:
        conn.execute("UPDATE device_profile_leases SET host = ?, pid = ?, token = ?", (socket.gethostname(), child.pid, "t"))
    assert store.claim_profile(KEY, ClaimOwner.this_process())  # a gone local owner: at once
