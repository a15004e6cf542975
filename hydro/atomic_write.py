"""``atomic_write``: a file written whole or not at all (a killed process or a full disk leaves the old file, or
none, never a truncated one)."""
from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing (``mode``: ``"w"`` or ``"wb"``); when the block ends
    without an error, flush it to disk and rename it to ``path`` (``os.replace``, atomic on one file system).
    Raises whatever writing raised (e.g. ``OSError`` for a full disk), with the temporary file removed and
    ``path`` untouched."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_write: mode must be 'w' or 'wb', got {mode!r}")
    directory, name = os.path.split(os.path.abspath(path))
    temporary = os.path.join(directory, f".{name}.{uuid.uuid4().hex[:12]}.tmp")  # the umask's permissions, as open's
    try:
        with open(temporary, mode.replace("w", "x")) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise
