"""Run clean-up callbacks when the process ends: normal exit (``atexit``), SIGTERM and SIGINT.

Used to put GPU power limits back when a plain trial process is stopped. The signal handlers are installed
while at least one callback is registered (from the main thread; elsewhere only ``atexit`` applies) and chain
the handlers that were there before: after the callbacks, the previous Python handler runs (SIGINT's default
raises ``KeyboardInterrupt``); a previous default action (SIGTERM's) is re-delivered so the process still ends
by that signal. An ignored signal stays ignored, and one whose handler was not set from Python is left alone.
"""
from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

logger = logging.getLogger(__name__)

SIGNALS = (signal.SIGTERM, signal.SIGINT)

_callbacks: list[Callable[[], None]] = []
_previous: dict[int, object] = {}  # signal -> the handler before ours, while ours is installed
_lock = threading.RLock()


def _run_callbacks() -> None:
    with _lock:
        callbacks = list(reversed(_callbacks))
        _callbacks.clear()
    for callback in callbacks:
        try:
            callback()
        except Exception:  # one failing clean-up must not keep the others from running
            logger.exception("exit guard: clean-up %r failed", callback)


def _handler(signum: int, frame: FrameType | None) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    _run_callbacks()
    _uninstall()
    if callable(previous):
        previous(signum, frame)
    else:  # SIG_DFL: the default action (the process ends by the signal)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)


def _install() -> None:
    if threading.current_thread() is not threading.main_thread():
        logger.debug("exit guard: not the main thread, so SIGTERM/SIGINT are not handled (atexit still is)")
        return
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if signum in _previous or current is None or current == signal.SIG_IGN:
            continue  # ours already, a handler not from Python (cannot be chained), or ignored (stays ignored)
        _previous[signum] = signal.signal(signum, _handler)


def _uninstall() -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for signum, previous in list(_previous.items()):
        if signal.getsignal(signum) is _handler:  # else someone chained on top of us: theirs still calls ours
            signal.signal(signum, previous)
            del _previous[signum]


def guard(callback: Callable[[], None]) -> None:
    """Run ``callback`` once when the process exits or receives SIGTERM/SIGINT, unless :func:`release`\\ d."""
    with _lock:
        _callbacks.append(callback)
        if len(_callbacks) == 1:
            _install()


def release(callback: Callable[[], None]) -> None:
    """Forget ``callback`` (its clean-up already ran); the last release removes the signal handlers."""
    with _lock:
        if callback in _callbacks:
            _callbacks.remove(callback)
        if not _callbacks:
            _uninstall()


atexit.register(_run_callbacks)
