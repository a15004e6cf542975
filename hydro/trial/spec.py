"""What the user hands Hydro to tune: a plain-torch workload (model, data, loss, metrics, optimizer)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from hydro.trial.data import DataSource, as_source
from hydro.trial.precision import Precision

MetricFn = Callable[[Tensor, Tensor], Tensor]

TRAIN_LOSS, VAL_LOSS = "train_loss", "val_loss"


def accuracy(output: Tensor, target: Tensor) -> Tensor:
    """Fraction of correct arg-max predictions: ``output`` ``[N, ..., C]`` logits, ``target`` ``[N, ...]``."""
    return (output.argmax(dim=-1) == target).float().mean()


@dataclass
class TuneSpec:
    """A workload written as plain torch, for one model and one configuration (a dict).

    - ``model(config) -> nn.Module``: the full-size model (Hydro shrinks and fuses it; no edits needed).
    - ``data() -> (train, val)``: each ``(inputs [N, ...], targets [N, ...])`` tensors or an object with
      ``.x``/``.y`` (the fast path: moved to the trial's device once), a map-style or iterable torch ``Dataset``
      of ``(input, target)`` samples, or a :class:`~hydro.trial.data.LoaderFactory` (your own ``DataLoader``).
    - ``loss``: a torch loss of one model's output and the targets, reduced to a scalar.
    - ``optimizer(params, config) -> torch.optim.Optimizer``: e.g. ``torch.optim.SGD(params, lr=config["lr"])``.
    - ``metrics``: extra validation metrics ``fn(output [N, ...], target) -> scalar`` (``val_loss`` is always
      reported, and ``train_loss``, the mean training loss of the epoch).
    - ``metric``/``mode``: the objective, one of the reported metric names.
    - ``batch_size``: default training batch size; a configuration's ``"batch_size"`` overrides it.
    - ``group_by``: configuration keys that change the architecture (members that differ in them are
      trained in different fused trials); the batch size always groups.
    - ``leaf_modules``: passed to ``hydro.fuse`` for layers torch.fx cannot trace into.
    - ``fallback_unfused``: when the model cannot be fused (or the optimizer translated), train the members
      as independent models instead of raising (full size only; the trial reports ``fused: False``).
    - ``seed``: seeds every member's initialisation and the order of the training batches.
    - ``checkpoint_every``: epochs between a trial's checkpoints (the last epoch always checkpoints); a
      retried or restored trial replays at most ``checkpoint_every - 1`` epochs.
    - ``shrink_fixed``, ``shrink_min_width``, ``shrink_strict``, ``shrink_readout_zero_init``: ``hydro.shrink``'s
      ``fixed`` (module paths kept at full width), ``min_width``, ``strict`` and ``readout_zero_init`` (``None``:
      its default) for the surrogates and the µP target.
    - ``device``: where a trial trains its members, batches and targets: ``"auto"`` (the GPU Ray assigned the
      trial, see ``gpus_per_trial``; else the CPU), ``"cpu"``, ``"cuda"``.
    - ``data_workers``: ``DataLoader`` worker processes per trial for ``Dataset`` splits (0: in the trial).
    - ``precision``: ``"fp32"``, ``"bf16"`` (autocast) or ``"fp16"`` (autocast, a dynamic loss scale per
      member: one member's overflow skips only its own step); see :mod:`hydro.trial.precision`.
    - ``compile``: ``torch.compile`` the fused model of each trial (compiles once per trial process and shape).
    - ``memory_budget_bytes``: memory one trial may use (default: the device's, or on CUDA the trial's share
      of the GPU); members that need more are split into smaller fused chunks (:mod:`hydro.trial.memory`).
    """

    model: Callable[[Mapping], nn.Module]
    data: Callable[[], tuple]
    loss: Callable[[Tensor, Tensor], Tensor]
    optimizer: Callable[..., torch.optim.Optimizer]
    metric: str = VAL_LOSS
    mode: str = "min"
    metrics: Mapping[str, MetricFn] = field(default_factory=dict)
    epochs: int = 5
    batch_size: int = 64
    group_by: Sequence[str] = ()
    leaf_modules: Sequence[type] = ()
    fallback_unfused: bool = False
    seed: int = 0
    checkpoint_every: int = 5
    shrink_fixed: tuple[str, ...] = ()
    shrink_min_width: int = 8
    shrink_strict: bool = False
    shrink_readout_zero_init: bool | None = None
    device: str = "auto"
    data_workers: int = 0
    precision: Precision = Precision.FP32
    compile: bool = False
    memory_budget_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"TuneSpec.mode must be 'min' or 'max', got {self.mode!r}")
        if self.epochs < 1:
            raise ValueError(f"TuneSpec.epochs must be >= 1, got {self.epochs}")
        if self.checkpoint_every < 1:
            raise ValueError(f"TuneSpec.checkpoint_every must be >= 1 (epochs), got {self.checkpoint_every}")
        if self.device != "auto":
            try:
                torch.device(self.device)
            except RuntimeError as error:
                raise ValueError(f"TuneSpec.device must be 'auto' or a torch device ('cpu', 'cuda', 'cuda:1'), "
                                 f"got {self.device!r}") from error
        try:
            self.precision = Precision(self.precision)
        except ValueError as error:
            raise ValueError(f"TuneSpec.precision must be one of {[p.value for p in Precision]}, "
                             f"got {self.precision!r}") from error
        if self.data_workers < 0:
            raise ValueError(f"TuneSpec.data_workers must be >= 0 (DataLoader worker processes), got {self.data_workers}")
        if self.metric not in self.metric_names():
            raise ValueError(f"TuneSpec.metric {self.metric!r} is not reported; the reported metrics are "
                             f"{self.metric_names()} (add it to TuneSpec.metrics)")

    def shrink_options(self) -> dict:
        """Keywords for ``hydro.shrink``."""
        options = {"fixed": tuple(self.shrink_fixed), "min_width": self.shrink_min_width, "strict": self.shrink_strict}
        if self.shrink_readout_zero_init is not None:
            options["readout_zero_init"] = self.shrink_readout_zero_init
        return options

    def metric_names(self) -> list[str]:
        """Every per-member metric a trial reports each epoch."""
        return [TRAIN_LOSS, VAL_LOSS, *self.metrics]

    def batch_size_of(self, config: Mapping) -> int:
        return int(config.get("batch_size", self.batch_size))

    def group_key(self, config: Mapping) -> tuple:
        """Members with equal keys can share one fused trial: the batch size and the ``group_by`` values."""
        return (self.batch_size_of(config), *(repr(config.get(k)) for k in self.group_by))

    def better(self, a: float, b: float) -> bool:
        """Whether metric value ``a`` is strictly better than ``b`` under ``mode``."""
        return a > b if self.mode == "max" else a < b

    def load_data(self) -> tuple[DataSource, DataSource]:
        """``(train, val)`` of ``data()`` as batch sources (see :mod:`hydro.trial.data`)."""
        loaded = self.data()
        if not isinstance(loaded, (tuple, list)) or len(loaded) < 2:
            raise ValueError("TuneSpec.data() must return (train, val), each (inputs, targets) tensors, an object "
                             "with .x/.y, a torch Dataset or a LoaderFactory")
        return as_source(loaded[0], "train", self.data_workers), as_source(loaded[1], "val", self.data_workers)
