"""What the user hands Hydro to tune: a plain-torch workload (model, data, loss, metrics, optimizer)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from hydro.binder import leaf_module_types
from hydro.checks import check, is_count
from hydro.trial.data import DataSource, as_source
from hydro.trial.backend import MemoryFormat, check_cuda_graphs
from hydro.trial.precision import Precision
from hydro.trial.schedule import ScheduleInterval

MetricFn = Callable[[Tensor, Tensor], Tensor]

TRAIN_LOSS, VAL_LOSS = "train_loss", "val_loss"


def _check_functions(spec: TuneSpec) -> None:
    """The four functions Hydro calls: the usual slips are a model instead of a function that builds one, a loss
    or optimizer class instead of an instance or a factory."""
    if isinstance(spec.model, nn.Module) or not callable(spec.model):
        fix = f"model=lambda config: {type(spec.model).__name__}(...)" if isinstance(spec.model, nn.Module) else \
            "model=lambda config: MyNet(width=config['width'])"
        raise TypeError(f"TuneSpec.model must be a function config -> nn.Module (Hydro builds a model per member), "
                        f"got {type(spec.model).__name__}. Fix: {fix}")
    if not callable(spec.data):
        raise TypeError(f"TuneSpec.data must be a function returning (train, val), got {type(spec.data).__name__}. "
                        f"Fix: data=lambda: (train, val)")
    if isinstance(spec.loss, type):
        raise TypeError(f"TuneSpec.loss is the class {spec.loss.__name__}; pass an instance, e.g. "
                        f"loss={spec.loss.__name__}()")
    if not callable(spec.loss):
        raise TypeError(f"TuneSpec.loss must be a loss function or module, got {type(spec.loss).__name__}")
    if isinstance(spec.optimizer, type) or not callable(spec.optimizer):
        name = spec.optimizer.__name__ if isinstance(spec.optimizer, type) else type(spec.optimizer).__name__
        factory = name if isinstance(spec.optimizer, type) else "torch.optim.SGD"
        raise TypeError(f"TuneSpec.optimizer is called as optimizer(params, config), got {name}. Fix: "
                        f"optimizer=lambda params, config: {factory}(params, lr=config['lr'])")


def _check_metrics(metrics: Mapping[str, MetricFn]) -> None:
    if not isinstance(metrics, Mapping):
        raise TypeError(f"TuneSpec.metrics must map names to functions, got {type(metrics).__name__}. "
                        f"Fix: metrics={{'val_acc': accuracy}}")
    for name, fn in metrics.items():
        if name in (TRAIN_LOSS, VAL_LOSS):
            raise ValueError(f"TuneSpec.metrics: {name!r} is reported by Hydro itself; give your metric another name")
        if not callable(fn):
            raise TypeError(f"TuneSpec.metrics[{name!r}] must be a function (output, target) -> scalar, "
                            f"got {type(fn).__name__}")


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
    - ``lr_scheduler(optimizer, config) -> torch LR scheduler`` (optional): the schedule of a member's optimizer
      (as ``optimizer`` built it), e.g. a ``SequentialLR`` of a ``LinearLR`` warm-up and a ``CosineAnnealingLR``;
      each member follows its own (see :mod:`hydro.trial.schedule` for the supported classes). Do not create
      it in ``optimizer``. ``ReduceLROnPlateau`` reduces on each member's ``metric`` (``mode`` its own).
    - ``lr_scheduler_interval``: ``"epoch"`` (step the schedule after every epoch) or ``"batch"`` (after every
      training batch).
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
    - ``memory_format``, ``tf32``, ``cudnn_benchmark``, ``cuda_graphs``: how the trial's kernels run
      (``"channels_last"`` batches and convolution weights; TF32 matmuls and convolutions on CUDA, ``None``:
      torch's defaults; cuDNN autotune on CUDA, ``None``: torch's default, off; the fused forward and backward
      replayed as CUDA graphs, CUDA only); see :mod:`hydro.trial.backend`.
    - ``memory_budget_bytes``: memory one trial may use (default: the device's, or on CUDA the trial's share
      of the GPU); members that need more are split into smaller fused chunks (:mod:`hydro.trial.memory`).
    """

    model: Callable[[Mapping], nn.Module]
    data: Callable[[], tuple]
    loss: Callable[[Tensor, Tensor], Tensor]
    optimizer: Callable[..., torch.optim.Optimizer]
    lr_scheduler: Callable[..., object] | None = None
    lr_scheduler_interval: ScheduleInterval = ScheduleInterval.EPOCH
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
    memory_format: MemoryFormat = MemoryFormat.CONTIGUOUS
    tf32: bool | None = None
    cudnn_benchmark: bool | None = None
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        _check_metrics(self.metrics)
        if self.mode not in ("min", "max"):
            raise ValueError(f"TuneSpec.mode must be 'min' or 'max', got {self.mode!r}")
        check("TuneSpec.", ("epochs", self.epochs, is_count, "an int >= 1"),
              ("batch_size", self.batch_size, is_count, "an int >= 1"),
              ("checkpoint_every", self.checkpoint_every, is_count, "an int >= 1 (epochs)"),
              ("seed", self.seed, lambda v: isinstance(v, int) and not isinstance(v, bool), "an int"),
              ("data_workers", self.data_workers, lambda v: is_count(v, 0),
               "an int >= 0 (DataLoader worker processes)"))
        for name in ("group_by", "shrink_fixed"):
            if isinstance(getattr(self, name), str):
                raise ValueError(f"TuneSpec.{name} must be a list of names, got the string {getattr(self, name)!r}. "
                                 f"Fix: {name}=[{getattr(self, name)!r}]")
        leaf_module_types(self.leaf_modules, "TuneSpec.leaf_modules")
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
        self._check_backend()
        if self.metric not in self.metric_names():
            raise ValueError(f"TuneSpec.metric {self.metric!r} is not reported; the reported metrics are "
                             f"{self.metric_names()} (add it to TuneSpec.metrics)")
        _check_functions(self)
        self._check_schedule()

    def _check_schedule(self) -> None:
        if self.lr_scheduler is not None and (isinstance(self.lr_scheduler, type) or not callable(self.lr_scheduler)):
            name = self.lr_scheduler.__name__ if isinstance(self.lr_scheduler, type) else \
                type(self.lr_scheduler).__name__
            raise TypeError(f"TuneSpec.lr_scheduler is called as lr_scheduler(optimizer, config), got {name}. Fix: "
                            f"lr_scheduler=lambda optimizer, config: torch.optim.lr_scheduler.CosineAnnealingLR("
                            f"optimizer, T_max=config['epochs'])")
        try:
            self.lr_scheduler_interval = ScheduleInterval(self.lr_scheduler_interval)
        except ValueError as error:
            raise ValueError(f"TuneSpec.lr_scheduler_interval must be one of {[i.value for i in ScheduleInterval]}, "
                             f"got {self.lr_scheduler_interval!r}") from error

    def _check_backend(self) -> None:
        """``memory_format``, ``tf32``, ``cudnn_benchmark``, ``cuda_graphs`` (see :mod:`hydro.trial.backend`)."""
        try:
            self.memory_format = MemoryFormat(self.memory_format)
        except ValueError as error:
            raise ValueError(f"TuneSpec.memory_format must be one of {[f.value for f in MemoryFormat]}, "
                             f"got {self.memory_format!r}") from error
        check("TuneSpec.", ("tf32", self.tf32, lambda v: v is None or isinstance(v, bool), "None or a bool"),
              ("cudnn_benchmark", self.cudnn_benchmark, lambda v: v is None or isinstance(v, bool), "None or a bool"),
              ("cuda_graphs", self.cuda_graphs, lambda v: isinstance(v, bool), "a bool"))
        if self.cuda_graphs and self.device != "auto":
            check_cuda_graphs(True, torch.device(self.device))

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
        if not isinstance(loaded, (tuple, list)) or len(loaded) != 2:
            got = f"{len(loaded)} values" if isinstance(loaded, (tuple, list)) else type(loaded).__name__
            raise ValueError(f"TuneSpec.data() must return (train, val), each (inputs, targets) tensors, an object "
                             f"with .x/.y, a torch Dataset or a LoaderFactory; got {got}")
        return as_source(loaded[0], "train", self.data_workers), as_source(loaded[1], "val", self.data_workers)
