"""Host memory a CPU trial keeps between its training steps.

glibc's ``malloc`` serves blocks larger than its mmap threshold straight from the system and gives the free
memory at the top of its heap back once more than its trim threshold is free. A fused trial's activations are F
members' at once: blocks of several MiB, allocated and freed every step, which the default thresholds hand back
and take again, each time faulting in (and zeroing) every page anew, in the kernel's time, which a member alone,
whose blocks are F times smaller, never pays. :func:`keep_freed_memory` raises both thresholds for the process, so
that freed blocks are reused by the next step. What is computed is unchanged; the process keeps the memory of its
largest step until it exits.
"""
from __future__ import annotations

import ctypes
import logging
import sys

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # blocks up to this many bytes come from the heap (glibc's largest on 64-bit)
TRIM_THRESHOLD = 2**30  # free bytes the heap keeps at its top before it gives memory back to the system


def keep_freed_memory() -> bool:
    """Make this process's ``malloc`` keep freed blocks of up to :data:`MMAP_THRESHOLD` bytes (and up to
    :data:`TRIM_THRESHOLD` free bytes) for reuse instead of returning them to the system (idempotent).

    Returns:
        Whether the thresholds were set: ``False`` where the C library is not glibc (nothing is changed there).
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return False
    done = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not done:
        logger.debug("glibc refused the malloc thresholds; freed host memory goes back to the system")
    return done
