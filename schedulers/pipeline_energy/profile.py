"""Per-instruction time/energy profiles of a pipeline, in Perseus's CSV format.

One row per (stage, instruction, frequency): ``stage,instruction,frequency,time,energy`` with the frequency
in MHz, the time of one instruction in s and its energy in J. ``p2p_power_w`` is the power (W) a stage
draws while it blocks on point-to-point communication (waiting for an activation or a gradient).
"""
from __future__ import annotations

import csv
import enum
from dataclasses import dataclass
from pathlib import Path

CSV_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")


class ProfileError(ValueError):
    """A profile is missing rows or has values that cannot be planned with."""


class Instruction(enum.Enum):
    """A pipeline instruction; values are Perseus's CSV names."""

    FORWARD = "forward"
    BACKWARD = "backward"

    @classmethod
    def parse(cls, name: str) -> Instruction:
        try:
            return cls(name.strip().lower())
        except ValueError:
            raise ProfileError(f"pipeline_energy: unknown instruction {name!r}; the CSV column 'instruction' takes "
                               f"{[i.value for i in cls]}.") from None


@dataclass(frozen=True)
class ProfileRow:
    """One instruction of one stage at one frequency: ``time_s`` per instruction, ``energy_j`` per instruction."""

    stage: int
    instruction: Instruction
    frequency_mhz: int
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class PipelineProfile:
    """All rows of a pipeline's profile plus its P2P-blocking power (W)."""

    rows: tuple[ProfileRow, ...]
    p2p_power_w: float

    def __post_init__(self) -> None:
        if not self.rows:
            raise ProfileError("pipeline_energy: the profile has no rows; profile every stage's forward and "
                               "backward at one frequency at least.")
        if self.p2p_power_w < 0:
            raise ProfileError(f"pipeline_energy: P2P blocking power {self.p2p_power_w} W is negative.")
        bad = [r for r in self.rows if r.time_s <= 0 or r.energy_j < 0]
        if bad:
            raise ProfileError(f"pipeline_energy: rows need time > 0 s and energy >= 0 J; got {bad[:3]}.")
        stages = sorted({r.stage for r in self.rows})
        if stages != list(range(len(stages))):
            raise ProfileError(f"pipeline_energy: stages must be 0..S-1 without gaps; the profile has {stages}.")
        missing = [(s, i.value) for s in stages for i in Instruction if not self.options(s, i)]
        if missing:
            raise ProfileError(f"pipeline_energy: no rows for (stage, instruction) {missing}; profile them.")

    @property
    def num_stages(self) -> int:
        return 1 + max(r.stage for r in self.rows)

    def options(self, stage: int, instruction: Instruction) -> list[ProfileRow]:
        """Rows of one instruction of one stage, highest frequency first."""
        rows = [r for r in self.rows if r.stage == stage and r.instruction is instruction]
        return sorted(rows, key=lambda r: -r.frequency_mhz)

    def at(self, stage: int, instruction: Instruction, frequency_mhz: int) -> ProfileRow:
        for row in self.options(stage, instruction):
            if row.frequency_mhz == frequency_mhz:
                return row
        raise ProfileError(f"pipeline_energy: stage {stage} {instruction.value} has no row at {frequency_mhz} MHz.")

    def fastest(self, stage: int, instruction: Instruction) -> ProfileRow:
        """The row of the highest frequency (the default, all-max plan)."""
        return self.options(stage, instruction)[0]

    def write_csv(self, path: str | Path) -> None:
        """The instruction rows in Perseus's format (the P2P power is not part of that file)."""
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(CSV_COLUMNS)
            for r in sorted(self.rows, key=lambda r: (r.stage, r.instruction.value != "forward", -r.frequency_mhz)):
                writer.writerow([r.stage, r.instruction.value, r.frequency_mhz, repr(r.time_s), repr(r.energy_j)])

    @classmethod
    def read_csv(cls, path: str | Path, p2p_power_w: float) -> PipelineProfile:
        """Rows from a Perseus CSV (extra columns are ignored) and the separately measured P2P power (W)."""
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = set(CSV_COLUMNS) - set(reader.fieldnames or ())
            if missing:
                raise ProfileError(f"pipeline_energy: {path} lacks columns {sorted(missing)}; Perseus's format is "
                                   f"{','.join(CSV_COLUMNS)}.")
            return cls(tuple(_row(line, path, n) for n, line in enumerate(reader, start=2)), p2p_power_w)


def _row(line: dict[str, str], path: str | Path, number: int) -> ProfileRow:
    try:
        return ProfileRow(int(line["stage"]), Instruction.parse(line["instruction"]), int(float(line["frequency"])),
                          float(line["time"]), float(line["energy"]))
    except (TypeError, ValueError) as err:
        if isinstance(err, ProfileError):
            raise
        raise ProfileError(f"pipeline_energy: {path} line {number}: {err}; expected numbers in stage, frequency, "
                           f"time and energy.") from err

