"""``hydro tune --energy`` and its options: the argparse group, and the :class:`EnergySettings` they give."""
from __future__ import annotations

import argparse
import os

from hydro.cli_options import UsageError
from hydro.energy.detect import detect_devices
from hydro.energy.tuning import DeviceSource, EnergySettings
from hydro.trial.spec import TuneSpec


# The energy options' values when not given; given without --energy, they are refused (they would do nothing).
DEFAULTS = {"energy_devices": DeviceSource.DETECT.value, "energy_store": os.path.expanduser("~/hydro_results/energy.db"),
            "energy_eta": 0.5, "energy_beta": 2.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``hydro tune --energy`` and its options."""
    group = parser.add_argument_group("energy (--energy)")
    group.add_argument("--energy", action="store_true",
                       help="measure every trial's energy and cost (per member too), stop costly groups at "
                            "beta x the least cost per member-epoch, pick each group's batch size with a bandit, "
                            "profile the power limit once per (members, batch size) (default: off)")
    group.add_argument("--energy-devices", choices=[d.value for d in DeviceSource],
                       help="detect: this host's GPUs (NVML) and CPU packages (RAPL); simulated: a simulated GPU per "
                            f"trial, for CPU-only machines (default: {DEFAULTS['energy_devices']})")
    group.add_argument("--energy-store", help=f"profiles and bandit history, shared by later runs of the same job "
                                              f"(default: {DEFAULTS['energy_store']})")
    group.add_argument("--energy-batch-sizes", type=int, nargs="*",
                       help="the bandit's batch sizes; none given: half, one and two times the workload's "
                            "(default); --energy-batch-sizes with no value: the bandit is off")
    group.add_argument("--energy-eta", type=float,
                       help=f"energy weight of the cost, in [0, 1] (default: {DEFAULTS['energy_eta']})")
    group.add_argument("--energy-beta", type=float, help=f"stop bound factor, > 1 (default: {DEFAULTS['energy_beta']})")


def settings_from_args(args: argparse.Namespace, spec: TuneSpec, job: str) -> EnergySettings | None:
    """The :class:`EnergySettings` of ``hydro tune`` arguments (None without ``--energy``). On an embedded local
    cluster, ``--energy-devices detect`` must find a device on this host."""
    given = [f"--{name.replace('_', '-')}" for name in (*DEFAULTS, "energy_batch_sizes") if getattr(args, name) is not None]
    if not args.energy:
        if given:
            raise UsageError(f"hydro tune: {', '.join(given)} only appl{'ies' if len(given) == 1 else 'y'} with "
                             f"--energy; add --energy or leave {'it' if len(given) == 1 else 'them'} out")
        return None
    options = {name: default if getattr(args, name) is None else getattr(args, name) for name, default in DEFAULTS.items()}
    local = not (args.address or os.environ.get("RAY_ADDRESS"))
    if options["energy_devices"] == DeviceSource.DETECT and local and not detect_devices():
        raise UsageError("hydro tune --energy: no device to measure on this host (no NVIDIA GPU through NVML, no "
                         "readable RAPL; see the warning above); use --energy-devices simulated on a CPU-only machine")
    sizes = args.energy_batch_sizes
    if sizes is None:
        sizes = sorted({max(1, spec.batch_size // 2), spec.batch_size, spec.batch_size * 2})
    try:
        return EnergySettings(options["energy_store"], job, DeviceSource(options["energy_devices"]),
                              options["energy_eta"], options["energy_beta"], tuple(sizes))
    except ValueError as error:
        raise UsageError(f"hydro tune --energy: {error}") from None
