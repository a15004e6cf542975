"""Ray sessions Hydro started, found and cleaned after their driver died without shutting them down.

A driver that starts a local cluster marks its session folder (:func:`mark`: the driver's pid and start time) and
spawns a watchdog (:func:`watch`, this file run as a script; standard library only, so it does not import Ray)
that outlives a SIGKILLed driver: once the driver is gone and the marker is still there, it stops the session's
leftover processes and removes its folder. Each later start also sweeps the Ray temp folder (:func:`sweep`) for
marked sessions whose driver and watchdog were both killed. Only marked sessions are touched, and of the
processes only those of the current user whose command line names the session folder or that hold a file in it
open: other users' and other drivers' clusters on the same machine are left alone. Linux only (``/proc``);
elsewhere these do nothing.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

MARKER = "hydro_driver.json"
POLL_S = 0.5
GRACE_S = 2.0

logger = logging.getLogger(__name__)


def _has_proc() -> bool:
    return os.path.isdir("/proc/self")


def start_time(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22); ``None`` if there
    is no such process or it has ended (a zombie its parent has not reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def mark(session_dir: str, pid: int | None = None) -> None:
    """Mark ``session_dir`` as started by driver ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    path = os.path.join(session_dir, MARKER)
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": pid, "start": start_time(pid)}, f)
    os.replace(path + ".tmp", path)


def driver_alive(session_dir: str) -> bool | None:
    """Whether the driver that marked ``session_dir`` still runs; ``None`` if the folder is not marked (or its
    marker is unreadable)."""
    try:
        with open(os.path.join(session_dir, MARKER)) as f:
            marker = json.load(f)
        pid, start = int(marker["pid"]), marker["start"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if start is None else start_time(pid) == start


def session_pids(folder: str) -> list[int]:
    """This user's processes (but this one) that name ``folder`` or a path inside it in their command line, or
    hold a file inside it open: Ray's agents and workers rewrite their command line (``ray::IDLE``) but keep
    their log files in the session folder open."""
    folder = os.path.realpath(folder)
    names = re.compile(re.escape(folder.encode()) + rb"(?:/|\x00|$)")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            if names.search(cmdline) or _holds_open(int(entry), folder):
                found.append(int(entry))
        except OSError:
            continue
    return _with_descendants(found)


def _parent(pid: int) -> int | None:
    """The parent of process ``pid`` (``/proc/<pid>/stat`` field 4), ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and this user's processes descended from them (Ray's workers are the raylet's children, and a
    worker need not hold a file of the session open), never this process or its parent."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == os.getuid() and (parent := _parent(int(entry))) is not None:
                    children.setdefault(parent, []).append(int(entry))
    found, todo = set(pids), list(pids)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found and child not in (os.getpid(), os.getppid()):
                found.add(child)
                todo.append(child)
    return sorted(found)


def _holds_open(pid: int, folder: str) -> bool:
    """Whether process ``pid`` has a file inside ``folder`` open."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder + "/"):
                return True
    return False


def kill_session(folder: str, grace_s: float = GRACE_S) -> list[int]:
    """Stop the processes :func:`session_pids` finds for ``folder``: SIGTERM, then SIGKILL to those still alive
    after ``grace_s`` seconds. Returns their pids."""
    pids = {pid: start_time(pid) for pid in session_pids(folder)}
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    alive = dict(pids)
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {pid: start for pid, start in alive.items() if start_time(pid) == start}
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    late = [pid for pid in session_pids(folder) if pid not in pids]  # started while the others stopped
    for pid in late:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return sorted({*pids, *late})


def remove_session(session_dir: str) -> None:
    """Remove ``session_dir`` and the ``session_latest`` link next to it when that names it."""
    latest = os.path.join(os.path.dirname(session_dir), "session_latest")
    if os.path.islink(latest) and os.path.realpath(latest) == os.path.realpath(session_dir):
        with contextlib.suppress(OSError):
            os.remove(latest)
    shutil.rmtree(session_dir, ignore_errors=True)


def clean(session_dir: str) -> None:
    """Stop the processes of ``session_dir`` and remove it."""
    pids = kill_session(session_dir)
    remove_session(session_dir)
    logger.info("hydro: cleaned the Ray session %s its driver left behind (%d processes stopped)",
                session_dir, len(pids))


def sweep(temp_dir: str) -> list[str]:
    """Clean every session folder in the Ray temp folder ``temp_dir`` that a driver marked and that driver is
    gone. Returns the folders cleaned."""
    if not _has_proc():
        return []
    cleaned = []
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(temp_dir)):
            path = os.path.join(temp_dir, name)
            if name.startswith("session_") and not os.path.islink(path) and driver_alive(path) is False:
                clean(path)
                cleaned.append(path)
    return cleaned


def spawn_watchdog(session_dir: str) -> subprocess.Popen | None:
    """Start :func:`watch` for the marked ``session_dir`` in a process session of its own (a signal to the
    driver's process group does not reach it); ``None`` without ``/proc``."""
    if not _has_proc():
        return None
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), session_dir], start_new_session=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def watch(session_dir: str, poll_s: float = POLL_S) -> None:
    """Wait for the driver that marked ``session_dir`` to end; if it left the marked folder behind, clean it."""
    while driver_alive(session_dir):
        time.sleep(poll_s)
    if driver_alive(session_dir) is False:
        clean(session_dir)


if __name__ == "__main__":
    watch(sys.argv[1])
