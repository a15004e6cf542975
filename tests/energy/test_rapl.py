"""RAPL backend on a fake powercap tree in tmp_path: zones, wraparound, permissions."""
from __future__ import annotations

from pathlib import Path

import pytest

from hydro.energy import LibraryNotFound, NotSupported, PermissionDenied
from hydro.energy.rapl import rapl_devices


def _zone(root, name, label, energy_uj, max_uj=1_000_000):
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(f"{label}\n")
    (z / "energy_uj").write_text(f"{energy_uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_top_level_zones_and_wraparound(tmp_path):
    z0 = _zone(tmp_path, "intel-rapl:0", "package-0", 900_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 5)  # sub-zone: inside package-0, not a device
    _zone(tmp_path, "intel-rapl:1", "package-1", 10)
    devs = rapl_devices(tmp_path)
    assert [d.name for d in devs] == ["rapl:0:package-0", "rapl:1:package-1"]
    start = devs[0].energy_j()
    (z0 / "energy_uj").write_text("200000\n")  # wrapped past 1_000_000
    assert devs[0].energy_j() - start == pytest.approx(0.3)
    with pytest.raises(NotSupported):
        devs[0].set_power_limit_w(100)


def test_missing_rapl_is_typed(tmp_path):
    with pytest.raises(LibraryNotFound, match="no RAPL zones"):
        rapl_devices(tmp_path / "nope")


def test_unreadable_counter_is_permission_denied(tmp_path, monkeypatch):
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 1)
    real_read = Path.read_text

    def read_text(self, *args, **kwargs):  # energy_uj is mode 0400 on patched kernels; we may run as root
        if self == z / "energy_uj":
            raise PermissionError(13, "Permission denied", str(self))
        return real_read(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    with pytest.raises(PermissionDenied, match="root"):
        rapl_devices(tmp_path)
