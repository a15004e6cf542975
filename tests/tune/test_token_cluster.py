"""``hydro tune --address`` to a cluster that uses token authentication fails in one line, exit code 2, within
seconds (``ray.init`` alone retries for about 28 s) when this machine has no token or the wrong one; with the
right token the probe lets the join go on. A real head started with ``RAY_AUTH_MODE=token ray start --head`` on
127.0.0.1, its processes stopped at the end (only this head's: those naming its temp folder). Each client runs in
a process of its own: Ray caches its token and authentication mode per process."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from hydro.tune.cluster import sessions as ray_sessions

REPO = Path(__file__).resolve().parents[2]
RAY = Path(sys.executable).with_name("ray")
TOKEN = "0123456789abcdef0123456789abcdef"
pytestmark = pytest.mark.skipif(not RAY.exists() or not os.path.isdir("/proc/self"),
                                reason="needs the ray command and /proc (Linux)")

CLI = textwrap.dedent('''
    import sys, time
    import hydro.tune.cli as cli
    from hydro.cli import main

    connect = cli.connect

    def timed(address):
        start = time.monotonic()
        try:
            return connect(address)
        finally:
            print(f"connect {time.monotonic() - start:.1f}", flush=True)

    cli.connect = timed
    sys.exit(main(sys.argv[1:]))
''')


def _env(home: Path, **extra: str) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO), "HOME": str(home),
            "RAY_USAGE_STATS_ENABLED": "0", **extra}


@pytest.fixture(scope="module")
def token_head():
    """``(address, home)``: a token-authenticated head on 127.0.0.1 and a home folder without a Ray token."""
    temp = Path(tempfile.mkdtemp(prefix="hytk", dir="/tmp"))  # short: Ray's socket paths live under it
    (temp / "home").mkdir()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    try:
        subprocess.run([str(RAY), "start", "--head", f"--port={port}", "--node-ip-address=127.0.0.1",
                        "--num-cpus=0", "--include-dashboard=false", f"--temp-dir={temp / 'ray'}",
                        "--disable-usage-stats"], check=True, capture_output=True, timeout=120,
                       env=_env(temp / "home", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN,
                                RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0"))
        yield f"127.0.0.1:{port}", temp / "home"
    finally:
        ray_sessions.kill_session(str(temp / "ray"))
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("token, refusal", [(None, "wants a token and this machine has none"),
                                            ("f" * 32, "refused this machine's Ray token")])
def test_join_without_the_token_fails_in_one_line(token_head, token, refusal):
    address, home = token_head
    run = subprocess.run([sys.executable, "-c", CLI, "tune", "--example", "digits-mlp", "--address", address],
                         cwd=REPO, capture_output=True, text=True, timeout=180,
                         env=_env(home, **({} if token is None else {"RAY_AUTH_TOKEN": token})))
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-3000:]
    assert lines == [f"hydro tune: the Ray cluster at {address} {refusal}; put the cluster's token in "
                     f"~/.ray/auth_token here (or $RAY_AUTH_TOKEN)"], run.stderr
    seconds = float(run.stdout.split("connect ")[1].split()[0])
    assert seconds < 10, seconds  # refused by the probe, not after ray.init's retries


def test_the_right_token_passes_the_probe(token_head):
    address, home = token_head
    probe = "import sys; from hydro.tune.cluster.auth import token_refused; print(token_refused(sys.argv[1]))"
    runs = {mode: subprocess.run([sys.executable, "-c", probe, address], cwd=REPO, capture_output=True, text=True,
                                 timeout=120, env=_env(home, RAY_AUTH_MODE=mode, RAY_AUTH_TOKEN=TOKEN))
            for mode in ("token", "disabled")}
    assert [runs[mode].stdout.strip() for mode in ("token", "disabled")] == ["False", "True"], runs
