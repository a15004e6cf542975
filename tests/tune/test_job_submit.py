"""``ray job submit -- python -m hydro.cli tune ...`` against a real ``ray start --head`` cluster.

The head runs in its own temp dir (so no other ``ray.init()`` on this machine, e.g. the ``ray_cluster``
fixture, finds and joins it) on free ports, with token authentication off for this throwaway cluster, and
is stopped (``ray start --block`` ends its own processes on SIGTERM) whatever happens.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def wait_for_dashboard(url: str, head: subprocess.Popen, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {head.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2):
                return
        except OSError:
            time.sleep(1)
    raise TimeoutError(f"the Ray dashboard at {url} did not come up in {timeout_s} s")


@pytest.mark.skipif(not RAY.exists(), reason="needs the `ray` command of this Python environment")
def test_ray_job_submit_runs_hydro_tune_on_the_running_cluster():
    gcs, dashboard, client, agent = free_ports(4)
    # A short temp dir: Ray's socket paths below it must fit the 107-character limit of Unix sockets.
    temp = Path(tempfile.mkdtemp(prefix="hj", dir="/tmp"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--num-cpus", "2", "--include-dashboard=true",
         "--dashboard-host", "127.0.0.1", "--port", str(gcs), "--dashboard-port", str(dashboard),
         "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
         "--min-worker-port", "0", "--max-worker-port", "0", "--temp-dir", str(temp / "ray")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{dashboard}"
        wait_for_dashboard(url, head)
        job = subprocess.run(
            [str(RAY), "job", "submit", "--address", url, "--working-dir", str(REPO), "--",
             sys.executable, "-m", "hydro.cli", "tune", "--example", "digits-mlp", "--samples", "4", "--scale",
             "8", "--epochs", "2", "--fusion", "2", "--scheduler", "none", "--storage", str(temp / "runs"),
             "--name", "job"],
            env=env, capture_output=True, text=True, timeout=240, check=False)
        out = job.stdout + job.stderr
        assert job.returncode == 0, out[-4000:]
        assert "Connecting to existing Ray cluster at address: " in out and f":{gcs}" in out  # not a new one
        assert "best configuration (target, val_acc = " in out
        rows = [line.split()[0] for line in out.splitlines() if line.strip().startswith(("m0000", "target "))]
        search = sorted(r for r in rows if "@" not in r)  # the default width ladder adds m0000x@4, m0000x@2 rows
        assert search == ["m00000", "m00001", "m00002", "m00003", "target"]
        assert (temp / "runs" / "job" / "hydro_best.json").exists()
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the group of `ray start --block`, which stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)
