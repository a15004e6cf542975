"""``ray job submit -- python -m hydro.cli tune ...`` and ``hydro tune --address`` against a real
``ray start --head`` cluster with Ray 2.60's token authentication on, running a workload file that
imports a module beside it.

The head runs in its own temp dir (so no other ``ray.init()`` on this machine, e.g. the ``ray_cluster``
fixture, finds and joins it) on free ports, with its own HOME (its own ``~/.ray/auth_token``), and is stopped
whatever happens: SIGKILL to the process group of ``ray start --block``, which holds the processes it started (the
workers the raylet starts in sessions of their own end with it). Its own SIGTERM handling stops them one by one
with grace periods, half a minute on a loaded machine, for nothing the test needs.
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
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.tune.user_project import write_project

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


def wait_for_server(url: str, head: subprocess.Popen, timeout_s: float = 90.0) -> None:
    """Wait until the head's HTTP server at ``url`` answers (an HTTP error counts: it is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"ray start --head exited with {head.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/api/version", timeout=2):
                return
        except urllib.error.HTTPError:  # up, and asking for the token
            return
        except OSError:
            time.sleep(0.2)  # (a refused connection answers at once: poll often)
    raise TimeoutError(f"the Ray server at {url} did not come up in {timeout_s} s")


def hydro_rows(out: str) -> list[str]:
    """The member table's search and target rows (a width ladder's rows, ``m0000x@S``, left out)."""
    rows = [line.split()[0] for line in out.splitlines() if line.strip().startswith(("m0000", "target "))
            and len(line.split()) > 1 and line.split()[1] in ("surrogate", "fused", "target", "plain")]  # a row
    return sorted(row for row in rows if "@" not in row)


@pytest.mark.skipif(not RAY.exists(), reason="needs the `ray` command of this Python environment")
def test_ray_job_submit_and_address_with_token_authentication(tmp_path):
    gcs, dashboard, client, agent = free_ports(4)
    # A short temp dir: Ray's socket paths below it must fit the 107-character limit of Unix sockets. HOME is a
    # fresh one too, so ~/.ray/auth_token is this test's.
    temp = Path(tempfile.mkdtemp(prefix="hj", dir="/tmp"))
    home = temp / "home"
    home.mkdir()
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        env.pop(name, None)
    # What an earlier local run leaves behind: a token. `ray start` then turns token authentication on.
    subprocess.run([str(RAY), "get-auth-token", "--generate"], env=env, capture_output=True, check=True, timeout=60)
    assert (home / ".ray" / "auth_token").exists()
    project = write_project(tmp_path / "project").parent  # a user's folder: the workload imports a module beside it
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", "--num-cpus", "2", "--include-dashboard=true",
         "--dashboard-host", "127.0.0.1", "--port", str(gcs), "--dashboard-port", str(dashboard),
         "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
         "--min-worker-port", "0", "--max-worker-port", "0", "--temp-dir", str(temp / "ray")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{dashboard}"
        wait_for_server(url, head)
        # The job submission goes through the head's dashboard agent, which starts after the dashboard; Ray's job
        # server waits only 10 s for it, less than it can take on a loaded 2-core machine ("No available agent").
        wait_for_server(f"http://127.0.0.1:{agent}", head)
        # As docs/cli.md says: the job submission client sends the token with RAY_AUTH_MODE=token.
        job = subprocess.run(
            [str(RAY), "job", "submit", "--address", url, "--working-dir", str(REPO), "--",
             sys.executable, "-m", "hydro.cli", "tune", "--workload", str(project / "my_workload.py"), "--samples",
             "2", "--fusion", "2", "--scheduler", "none", "--storage", str(temp / "runs"), "--name", "job",
             "--verbose"],
            env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=300, check=False)
        out = job.stdout + job.stderr
        assert job.returncode == 0, out[-4000:]
        assert "Connecting to existing Ray cluster at address: " in out and f":{gcs}" in out  # not a new one
        assert "best configuration (target, val_acc = " in out
        assert hydro_rows(out) == ["m00000", "m00001", "target"]
        assert (temp / "runs" / "job" / "hydro_best.json").exists()
        # `hydro tune --address` reads the token itself (RAY_AUTH_MODE unset), from the user's folder.
        direct = subprocess.run(
            [sys.executable, "-m", "hydro.cli", "tune", "--address", f"127.0.0.1:{gcs}", "--workload",
             "my_workload.py", "--samples", "2", "--fusion", "2", "--scheduler", "none", "--storage",
             str(temp / "runs"), "--name", "direct"],
            cwd=project, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
            check=False)
        out = direct.stdout + direct.stderr
        assert direct.returncode == 0, out[-4000:]
        assert "Missing authentication token" not in out and hydro_rows(out) == ["m00000", "m00001", "target"]
    finally:
        os.killpg(head.pid, signal.SIGKILL)  # the group of `ray start --block`: what it started
        head.wait()
        shutil.rmtree(temp, ignore_errors=True)
