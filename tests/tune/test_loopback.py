"""The local cluster ``hydro tune`` starts (no ``--address``) listens on loopback only: every TCP
socket its processes (driver, GCS, raylet, workers, agents) listen on is bound to 127.0.0.1, checked with
``ss -ltnp`` in a driver process of its own."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

DRIVER = textwrap.dedent('''
    import os, subprocess
    import ray
    from hydro.tune.cli import connect

    connect(None)
    ray.get(ray.remote(lambda: 1).remote())  # a worker is up too

    def descendants(root):
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                children.setdefault(ppid, []).append(int(entry))
        found, todo = set(), [root]
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo.extend(children.get(pid, []))
        return found

    ours = descendants(os.getpid())
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines():
        pids = {int(p.split(",")[0]) for p in line.split("pid=")[1:]}
        if pids & ours:
            print("LISTEN", line.split()[3], line.split("users:")[-1])
    ray.shutdown()
''')


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_embedded_cluster_listens_on_loopback_only():
    run = subprocess.run([sys.executable, "-c", DRIVER], cwd=REPO, capture_output=True, text=True, timeout=240,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
                              "HOME": str(Path.home())})
    assert run.returncode == 0, run.stderr[-3000:]
    sockets = [line.split()[1:] for line in run.stdout.splitlines() if line.startswith("LISTEN ")]
    names = " ".join(s[1] for s in sockets)
    assert "gcs_server" in names and "raylet" in names, run.stdout  # the cluster's own processes were seen
    exposed = [s for s in sockets if s[0].rsplit(":", 1)[0] not in ("127.0.0.1", "[::ffff:127.0.0.1]", "[::1]")]
    assert not exposed, exposed


def test_the_embedded_cluster_is_started_beside_a_cluster_ray_start_left_behind(tmp_path):
    """``ray start`` writes its address to ``<ray temp>/ray_current_cluster``; ``hydro tune`` without an address
    starts its own cluster even when that file names a cluster that is gone (``ray.init()`` would try to join it)."""
    temp = Path(tempfile.mkdtemp(prefix="hy", dir="/tmp"))  # short: Ray's socket paths live under it
    try:
        (temp / "ray").mkdir()
        (temp / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")  # nothing listens there
        driver = ("import ray\nfrom hydro.tune.cli import connect\nconnect(None)\n"
                  "print('ran', ray.get(ray.remote(lambda: 1).remote()))\nray.shutdown()\n")
        run = subprocess.run([sys.executable, "-c", driver], cwd=REPO, capture_output=True, text=True, timeout=180,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0",
                                  "HOME": str(Path.home()), "RAY_TMPDIR": str(temp)})
        assert run.returncode == 0 and "ran 1" in run.stdout, run.stderr[-3000:]
    finally:
        shutil.rmtree(temp, ignore_errors=True)
