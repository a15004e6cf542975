"""``atomic_write``: the file is replaced whole when the block ends, untouched when it raises."""
import os

import pytest

from hydro.atomic_write import atomic_write


def test_a_file_is_written_whole_or_left_as_it_was(tmp_path):
    path = tmp_path / "hydro_members.csv"
    with atomic_write(path) as f:
        f.write("member,val_acc\n")
    assert path.read_text() == "member,val_acc\n"
    with pytest.raises(OSError, match="No space left"):
        with atomic_write(path) as f:
            f.write("partial")
            raise OSError(28, "No space left on device")
    assert path.read_text() == "member,val_acc\n" and os.listdir(tmp_path) == ["hydro_members.csv"]
    with atomic_write(path, "wb") as f:
        f.write(b"binary")
    assert path.read_bytes() == b"binary"
