"""Sessions of a SIGKILLed Hydro driver are cleaned, by the next Hydro start or by the driver's watchdog, on a
machine where another (unmarked) Ray session runs and is left alone. Real local clusters, each started by a
driver process of its own, in a Ray temp folder of this test's own."""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from hydro.tune.cluster import sessions as ray_sessions

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc (Linux)")

HYDRO_DRIVER = textwrap.dedent('''
    import sys, ray
    from hydro.tune.run import start_local_cluster
    start_local_cluster()
    ray.get(ray.remote(lambda: 1).remote())  # a worker is up too
    print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
    sys.stdin.read()
''')
PLAIN_DRIVER = textwrap.dedent('''
    import sys, ray
    ray.init(num_cpus=1, include_dashboard=False)
    one = ray.remote(lambda: 1)
    ray.get(one.remote())
    print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
    for line in sys.stdin:  # a task for each line: the cluster still works
        print("ran", ray.get(one.remote()), flush=True)
    ray.shutdown()
''')


def _driver(code: str, temp: str) -> tuple[subprocess.Popen, str]:
    """A driver process running ``code`` with Ray's temp folder in ``temp``, and its session folder."""
    driver = _start(code, temp)
    return driver, _session(driver)


def _start(code: str, temp: str) -> subprocess.Popen:
    """A driver process running ``code`` with Ray's temp folder in ``temp`` (see :func:`_session`)."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HOME": str(Path.home()),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": temp}
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _session(driver: subprocess.Popen) -> str:
    """The session folder of a driver of :func:`_start`, once its cluster runs."""
    ready, _, _ = select.select([driver.stdout], [], [], 120)
    line = driver.stdout.readline().strip() if ready else ""
    if not line:
        driver.kill()
        pytest.fail("the driver did not start its cluster within 120 s")
    return line


def _alive(pids: dict[int, int | None]) -> set[int]:
    return {pid for pid, start in pids.items() if ray_sessions.start_time(pid) == start}


def _processes(session_dir: str) -> dict[int, int | None]:
    return {pid: ray_sessions.start_time(pid) for pid in ray_sessions.session_pids(session_dir)}


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")
    except OSError:  # it ended meanwhile
        return []


def _titles(pids) -> set[str]:
    """The process titles Ray's agents and workers give themselves (``ray::...``) among ``pids``."""
    return {args[0].strip() for args in map(_cmdline, pids) if args and args[0].startswith("ray::")}


def _kill(driver: subprocess.Popen) -> None:
    driver.send_signal(signal.SIGKILL)
    driver.wait(10)


def _wait_gone(session_dir: str, pids: dict[int, int | None], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (os.path.exists(session_dir) or _alive(pids)) and time.monotonic() < deadline:
        time.sleep(0.2)


def _sleeper(*args: str) -> subprocess.Popen:
    """A process whose command line holds ``args``."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args])


def test_sweep_cleans_only_marked_sessions_whose_driver_is_gone(tmp_path):
    """No Ray: fake session folders, each named by a process's command line; a folder whose name is a prefix of
    another's (``..._12`` and ``..._123``) does not claim the other's processes."""
    driver = _sleeper()
    folders = {name: tmp_path / f"session_2026_{name}" for name in ("12", "123", "alive", "plain")}
    for folder in folders.values():
        folder.mkdir()
    ray_sessions.mark(str(folders["12"]), driver.pid)
    driver.kill()
    driver.wait()  # its driver is gone
    ray_sessions.mark(str(folders["alive"]))  # its driver is this process
    processes = {name: _sleeper(f"--session-dir={folder}", f"--log-dir={folder}/logs")
                 for name, folder in folders.items()}
    try:
        assert ray_sessions.driver_alive(str(folders["plain"])) is None
        assert ray_sessions.session_pids(str(folders["12"])) == [processes["12"].pid]
        assert ray_sessions.sweep(str(tmp_path)) == [str(folders["12"])]
        assert processes["12"].wait(10) == -signal.SIGTERM
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for n, f in folders.items() if n != "12")
        assert all(processes[name].poll() is None for name in ("123", "alive", "plain"))
    finally:
        for process in processes.values():
            process.kill()
            process.wait()


def test_killed_drivers_sessions_are_cleaned_and_others_left_alone():
    temp = tempfile.mkdtemp(prefix="hyrs", dir="/tmp")  # short: Ray's socket paths live under it
    drivers: list[subprocess.Popen] = []
    try:
        # The unmarked session and the first Hydro driver's start together (a start is seconds of waiting on the
        # cluster's processes); the second Hydro start below sweeps the folder with both in it.
        plain, first = _start(PLAIN_DRIVER, temp), _start(HYDRO_DRIVER, temp)
        drivers += [plain, first]
        plain_dir = _session(plain)
        plain_pids = _processes(plain_dir)
        assert "ray::DashboardAgent" in _titles(plain_pids), plain_pids  # its agents, raylet, GCS... are found
        plain_core = {pid: start for pid, start in plain_pids.items() if "ray::IDLE" not in _titles([pid])}

        # 1. A driver and its watchdog SIGKILLed together: the next Hydro start cleans the session.
        first_dir = _session(first)
        first_pids = _processes(first_dir)
        watchdogs = [pid for pid in first_pids if any(a.endswith(os.path.join("tune", "cluster", "sessions.py")) for a in _cmdline(pid))]
        assert len(watchdogs) == 1, first_pids
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent", "ray::IDLE"} <= _titles(first_pids), first_pids
        os.kill(watchdogs[0], signal.SIGKILL)
        _kill(first)
        time.sleep(1)
        assert os.path.isdir(first_dir) and _alive(first_pids), "nothing cleaned it yet"  # Ray's leftovers

        second, second_dir = _driver(HYDRO_DRIVER, temp)  # start_local_cluster sweeps the temp folder
        drivers.append(second)
        _wait_gone(first_dir, first_pids, 10)
        assert not os.path.exists(first_dir) and not _alive(first_pids)

        # 2. A driver SIGKILLed alone: its watchdog cleans the session within seconds.
        second_pids = _processes(second_dir)
        assert {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} <= _titles(second_pids), second_pids
        _kill(second)
        _wait_gone(second_dir, second_pids, 20)
        assert not os.path.exists(second_dir) and not _alive(second_pids)

        # The unmarked session is untouched: its folder, its processes (but idle workers, which Ray may end) and
        # its cluster, which still runs a task.
        assert os.path.isdir(plain_dir) and _alive(plain_core) == set(plain_core), plain_core
        plain.stdin.write("again\n")
        plain.stdin.flush()
        ready, _, _ = select.select([plain.stdout], [], [], 60)
        assert ready and plain.stdout.readline().strip() == "ran 1"
        assert ray_sessions.sweep(os.path.dirname(plain_dir)) == []
        plain.stdin.close()
        assert plain.wait(60) == 0
    finally:
        for driver in drivers:
            if driver.poll() is None:
                driver.kill()
                driver.wait(10)
        for session in Path(temp, "ray").glob("session_2*"):
            ray_sessions.kill_session(str(session))
        shutil.rmtree(temp, ignore_errors=True)
