"""Readers for the Zeus traces (``summary_train.csv``, ``summary_power_*.csv``, ``profile/*.csv``).

The traces live outside the repository, by default in ``<repo>/../shared/data/zeus-traces``; the
environment variable ``HYDRO_ZEUS_TRACES`` or an explicit ``path`` argument overrides that.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

TRACES_ENV = "HYDRO_ZEUS_TRACES"
_DEFAULT_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "zeus-traces"


class TraceError(ValueError):
    """The trace directory or a trace file is missing, or a workload/batch size is not in it."""


@dataclass(frozen=True)
class Workload:
    """A recurring training job of the Zeus paper.

    ``target`` is the metric value to reach, ``max_epochs`` the epoch budget, ``default_batch_size``
    the user's b0 (capped to the largest batch size in the power trace) and ``train_samples`` the
    number of training samples per epoch (used to size the JIT power-limit profiling windows).
    """

    dataset: str
    network: str
    optimizer: str
    target: float
    max_epochs: int
    default_batch_size: int
    train_samples: int


# The six workloads of the Zeus paper (table in the traces' README). Sample counts are the public
# training-set sizes (MovieLens-1M: 994,169 ratings with 4 sampled negatives each, as NCF trains).
WORKLOADS: dict[str, Workload] = {
    w.dataset: w
    for w in (
        Workload("cifar100", "shufflenetv2", "adadelta", 0.6, 100, 1024, 50_000),
        Workload("imagenet", "resnet50", "adadelta", 0.65, 100, 256, 1_281_167),
        Workload("squad", "bert_base_uncased", "adamw", 84.0, 6, 32, 88_524),
        Workload("librispeech", "deepspeech2", "adamw", 40.0, 16, 256, 281_241),
        Workload("movielens-1m", "ncf", "adam", 0.41, 100, 1024, 4_970_845),
        Workload("sentiment140", "bert_base_uncased", "adamw", 0.84, 10, 128, 1_600_000),
    )
}


def traces_dir(path: str | os.PathLike[str] | None = None) -> Path:
    """The Zeus trace directory: ``path``, else ``$HYDRO_ZEUS_TRACES``, else ``<repo>/../shared/...``."""
    chosen = Path(path) if path is not None else Path(os.environ.get(TRACES_ENV, _DEFAULT_DIR))
    if not (chosen / "summary_train.csv").is_file():
        raise TraceError(
            f"Zeus traces not found in {chosen} (no summary_train.csv). Put the shared data beside the "
            f"repository (<repo>/../shared/data/zeus-traces), or pass its path / set ${TRACES_ENV}."
        )
    return chosen


def available_gpus(path: str | os.PathLike[str] | None = None) -> list[str]:
    """The GPUs with a power trace in the trace directory (see :func:`traces_dir`)."""
    return sorted(p.stem.removeprefix("summary_power_") for p in traces_dir(path).glob("summary_power_*.csv"))


@dataclass(frozen=True)
class PowerPoint:
    """Per-epoch behaviour of one (batch size, power limit): seconds per epoch and average W."""

    time_per_epoch_s: float
    average_power_w: float


class ZeusTraces:
    """Training paths and power measurements of one GPU's trace, per workload and batch size."""

    def __init__(self, gpu: str, path: str | os.PathLike[str] | None = None) -> None:
        root = traces_dir(path)
        power_file = root / f"summary_power_{gpu.lower()}.csv"
        if not power_file.is_file():
            raise TraceError(f"No power trace for GPU {gpu!r} in {root}; available: {available_gpus(path)}.")
        self.gpu = gpu.lower()
        self._train = pd.read_csv(root / "summary_train.csv")
        self._power = pd.read_csv(power_file)

    def _power_rows(self, w: Workload) -> pd.DataFrame:
        p = self._power
        return p[(p.dataset == w.dataset) & (p.network == w.network) & (p.optimizer == w.optimizer)]

    def power_limits(self, w: Workload) -> list[int]:
        """Power limits (W) in the trace for the workload, ascending."""
        return sorted(int(x) for x in self._power_rows(w).power_limit.unique())

    def max_power_w(self, w: Workload) -> float:
        """MaxPower of the cost: the highest power limit of the trace (one GPU), W."""
        return float(max(self.power_limits(w)))

    def batch_sizes(self, w: Workload) -> list[int]:
        """Batch sizes with both training paths and power measurements, ascending."""
        t = self._train
        trained = set(t[(t.dataset == w.dataset) & (t.network == w.network)].batch_size)
        return sorted(int(b) for b in trained & set(self._power_rows(w).batch_size))

    def default_batch_size(self, w: Workload) -> int:
        """b0: the workload default, capped by the largest batch size in this GPU's trace."""
        sizes = self.batch_sizes(w)
        return max(b for b in sizes if b <= w.default_batch_size)

    def power(self, w: Workload, batch_size: int) -> dict[int, PowerPoint]:
        """Per-epoch time (s) and average power (W) for each power limit (W) at ``batch_size``."""
        rows = self._power_rows(w)
        rows = rows[rows.batch_size == batch_size]
        if rows.empty:
            raise TraceError(f"{w.dataset}: batch size {batch_size} not in the {self.gpu} power trace.")
        return {
            int(r.power_limit): PowerPoint(float(r.time_per_epoch), float(r.average_power))
            for r in rows.itertuples()
        }

    def epochs_to_target(self, w: Workload, batch_size: int) -> list[float]:
        """Epochs each seeded run of ``batch_size`` needed to reach the target; ``inf`` if it never did
        within ``max_epochs``. One entry per run in the trace."""
        t = self._train
        rows = t[(t.dataset == w.dataset) & (t.network == w.network) & (t.batch_size == batch_size)]
        if rows.empty:
            raise TraceError(f"{w.dataset}: batch size {batch_size} not in the training trace.")
        hits = rows[(rows.target_metric - w.target).abs() < 1e-9].dropna(subset=["target_epoch"])
        first = hits.groupby("run").target_epoch.min()
        out = []
        for run in sorted(rows.run.unique()):
            epoch = float(first.get(run, math.inf))
            out.append(epoch if epoch <= w.max_epochs else math.inf)
        return out


@dataclass(frozen=True)
class ProfileWindow:
    """One JIT profiling window of a Zeus profile log: limit (W), duration (s), energy summed over GPUs (J)."""

    power_limit_w: int
    time_s: float
    energy_j: float


def read_profile_log(file: str | os.PathLike[str]) -> tuple[int, list[ProfileWindow]]:
    """Read ``profile/GPU+model+gpus.csv``: returns (number of GPUs, windows in log order)."""
    df = pd.read_csv(file)
    gpu_cols = [c for c in df.columns if c.startswith("gpu") and c.endswith("_energy")]
    prefix = "__GlobalPowerLimitOptimizer_"
    if not gpu_cols or not df.window_name.str.startswith(prefix).all():
        raise TraceError(f"{file} is not a Zeus power-limit profile log (columns {list(df.columns)}).")
    windows = [
        ProfileWindow(int(r.window_name.removeprefix(prefix)), float(r.elapsed_time), float(r[gpu_cols].sum()))
        for _, r in df.iterrows()
    ]
    return len(gpu_cols), windows
