"""Profiling on this process's device: timed training steps with their peak memory, and per-layer features
(FLOPs, bytes moved, shapes) and forward+backward timings of a model's layers, fused ``F`` times, that fit
:class:`schedulers.prediction.step_time.StepTimeModel`.

Layers are the model's leaf modules, each profiled with the input shapes it saw on an example batch; work done
in ``forward`` by functional calls outside modules is not a layer and is not counted.
"""
from __future__ import annotations

import copy
import math
import resource
import statistics
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hydro.binder import fuse
from hydro.optim import SGD
from hydro.trial.host_memory import keep_freed_memory
from schedulers.prediction.step_time import OPTIMIZER, LayerFeatures, LayerTiming, StepTimeModel

_NORMS = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)
_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORM_FLOPS_PER_ELEMENT = 8  # mean, variance, normalise, scale, shift
_SGD_FLOPS_PER_PARAM = 4  # momentum update and step


@dataclass
class ProfiledLayer:
    """A leaf module of the model, the shapes and dtypes of the tensors it was called with, and its features."""

    name: str
    module: nn.Module
    inputs: list[tuple[tuple[int, ...], torch.dtype]]
    features: LayerFeatures


def profile_layers(model: nn.Module, example: Tensor) -> list[ProfiledLayer]:
    """The leaf modules of ``model`` in call order, with their features on the batch ``example`` ``[N, ...]``
    (one entry per call: a module called twice appears twice)."""
    names = {m: n for n, m in model.named_modules()}
    layers: list[ProfiledLayer] = []

    def record(module: nn.Module, args: tuple, output: Tensor) -> None:
        tensors = [a for a in args if isinstance(a, Tensor)]
        if not tensors or not isinstance(output, Tensor):
            raise ValueError(f"hydro.profiling: layer {names[module]!r} ({type(module).__name__}) must take and "
                             "return tensors to be profiled; profile its submodules instead")
        layers.append(ProfiledLayer(names[module], module, [(tuple(t.shape), t.dtype) for t in tensors],
                                    _features(module, tensors[0], output)))

    handles = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    try:
        with torch.no_grad():
            model(example)
    finally:
        for handle in handles:
            handle.remove()
    return layers


def optimizer_features(model: nn.Module) -> LayerFeatures:
    """The optimizer-step pseudo-layer of one member: its parameters updated once (SGD with momentum)."""
    params = sum(p.numel() for p in model.parameters() if p.requires_grad)
    # reads weight, gradient, momentum; writes weight, momentum
    return LayerFeatures(OPTIMIZER, _SGD_FLOPS_PER_PARAM * params, 5 * 4 * params, params, 0.0, (params,))


def step_features(model: nn.Module, example: Tensor) -> list[LayerFeatures]:
    """Features of one member's training step: its layers on ``example`` and the optimizer pseudo-layer."""
    return [layer.features for layer in profile_layers(model, example)] + [optimizer_features(model)]


def time_layer(layer: ProfiledLayer, members: int, device: torch.device | str = "cpu", rounds: int = 5,
               min_time_s: float = 0.002, clock: Callable[[], float] = time.perf_counter) -> LayerTiming:
    """Median over ``rounds`` of the mean seconds of forward+backward of ``layer`` fused ``members`` times
    (per-member inputs ``[F, ...]``, as an inner layer of a fused model), each round at least ``min_time_s``.
    ``clock``: wall time, or ``time.thread_time`` to count only this thread's CPU time (a shared CPU with
    one torch thread: what an idle core would take)."""
    return time_layers([layer], members, device, rounds, min_time_s, clock)[0]


def time_layers(layers: Sequence[ProfiledLayer], members: int, device: torch.device | str = "cpu", rounds: int = 5,
                min_time_s: float = 0.002, clock: Callable[[], float] = time.perf_counter) -> list[LayerTiming]:
    """:func:`time_layer` of each of ``layers``, their rounds interleaved: every layer's round ``r`` runs before
    any layer's round ``r + 1``, so a burst of other work on a shared machine spoils one round of many layers
    (which their medians drop) rather than every round of one. Holds all ``layers`` fused at once."""
    device = torch.device(device)
    steps = [_layer_step(layer, members, device) for layer in layers]
    seconds = _median_seconds(steps, device, rounds, min_time_s, clock)
    return [LayerTiming(layer.features, members, s) for layer, s in zip(layers, seconds)]


def _layer_step(layer: ProfiledLayer, members: int, device: torch.device) -> Callable[[], None]:
    """Forward+backward of ``layer`` fused ``members`` times on example inputs ``[F, ...]``."""
    wrapped = [nn.Sequential(copy.deepcopy(layer.module)) for _ in range(members)]  # traced as a child layer
    fused = fuse(wrapped, fused_inputs=True).to(device)
    inputs = [_example_tensor((members, *shape), dtype, layer.module, device) for shape, dtype in layer.inputs]

    def step() -> None:
        output = fused(*inputs)
        if output.requires_grad:
            output.backward(torch.ones_like(output))

    return step


def time_optimizer(model: nn.Module, members: int, device: torch.device | str = "cpu", rounds: int = 5,
                   min_time_s: float = 0.002, clock: Callable[[], float] = time.perf_counter) -> LayerTiming:
    """Median seconds of one fused SGD-with-momentum step over ``members`` copies of ``model``'s parameters
    (``clock`` as in :func:`time_layer`)."""
    device = torch.device(device)
    params = [torch.zeros(members, *p.shape, device=device, requires_grad=True) for p in model.parameters()
              if p.requires_grad]
    for p in params:
        p.grad = torch.ones_like(p)
    optimizer = SGD(params, lr=1e-3, momentum=0.9)
    return LayerTiming(optimizer_features(model), members, _median_seconds([optimizer.step], device, rounds,
                                                                           min_time_s, clock)[0])


def fit_step_time_model(model: nn.Module, example: Tensor, members: Sequence[int] = (1, 4, 16),
                        device: torch.device | str = "cpu", name: str | None = None,
                        clock: Callable[[], float] = time.perf_counter) -> StepTimeModel:
    """A step-time model of ``device`` fitted on ``model``'s own layers and optimizer step timed at each count
    of ``members`` (``clock`` as in :func:`time_layer`)."""
    device = torch.device(device)
    layers = profile_layers(model, example)
    timings = [timing for f in members for timing in time_layers(layers, f, device, clock=clock)]
    timings += [time_optimizer(model, f, device, clock=clock) for f in members]
    return StepTimeModel.fit(name or device_name(device), timings)


def device_name(device: torch.device | str) -> str:
    """The device type a model is fitted for: the CUDA device's name, or ``"cpu"``."""
    device = torch.device(device)
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _features(module: nn.Module, x: Tensor, y: Tensor) -> LayerFeatures:
    params = sum(p.numel() for p in module.parameters())
    nbytes = x.numel() * x.element_size() + y.numel() * y.element_size() + 4 * params
    saved = x.numel() * x.element_size()
    if isinstance(module, nn.Linear):
        flops, shape = 2 * x.numel() * module.out_features, (x.numel() // module.in_features, module.in_features,
                                                              module.out_features)
    elif isinstance(module, _CONVS):
        kernel = math.prod(module.kernel_size)
        flops = 2 * y.numel() * (module.in_channels // module.groups) * kernel
        shape = (*x.shape, module.out_channels, *module.kernel_size)
    elif isinstance(module, _NORMS):
        flops, shape = _NORM_FLOPS_PER_ELEMENT * x.numel(), tuple(x.shape)
    elif isinstance(module, nn.Embedding):
        flops, shape, saved = 0, (x.numel(), module.embedding_dim), x.numel() * x.element_size()
    else:  # elementwise, pooling, dropout: one operation per input element
        flops, shape = x.numel(), tuple(x.shape)
    return LayerFeatures(type(module).__name__, float(flops), float(nbytes), params, float(saved), shape)


def _example_tensor(shape: tuple[int, ...], dtype: torch.dtype, module: nn.Module, device: torch.device) -> Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, dtype=dtype, device=device, requires_grad=True)
    high = module.num_embeddings if isinstance(module, nn.Embedding) else 2
    return torch.randint(0, high, shape, dtype=dtype, device=device)


def _median_seconds(steps: Sequence[Callable[[], None]], device: torch.device, rounds: int, min_time_s: float,
                    clock: Callable[[], float]) -> list[float]:
    """Per step, the median over ``rounds`` of its mean seconds per call in a round of at least ``min_time_s``;
    the steps take turns round by round."""
    for step in steps:
        step()  # warm-up
    means: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for step, samples in zip(steps, means):
            _synchronize(device)
            start, calls = clock(), 0
            while calls == 0 or clock() - start < min_time_s:
                step()
                calls += 1
            _synchronize(device)
            samples.append((clock() - start) / calls)
    return [statistics.median(samples) for samples in means]


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op CPU threads set to ``threads`` inside the block (``None``: unchanged)."""
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def user_cpu_s() -> float:
    """This process's user CPU time in seconds, all its threads: a step's work, whatever else the machine runs (and
    without the kernel's time, e.g. a fresh process's page faults)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_utime


def throughput_clock(device: torch.device | str) -> Callable[[], float]:
    """The clock to compare training steps' throughput on ``device`` by: this thread's CPU time
    (``time.thread_time``, nanosecond resolution) on a CPU that trains with one torch thread, which runs every
    operation in the calling thread (there the step's work is its time on an idle core, so other processes' load does
    not bias a comparison), else the wall clock (a GPU, or several CPU threads, whose idle waits are part of a
    step)."""
    if torch.device(device).type == "cpu" and torch.get_num_threads() == 1:
        return time.thread_time
    return time.perf_counter


def free_memory_bytes(device: torch.device | str = "cpu") -> int:
    """Free memory of ``device``: CUDA's free device memory, or the available RAM (Linux ``MemAvailable``)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable")) * 1024


def training_tensors(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """Parameters, buffers, gradients and optimizer state: what stays resident between steps."""
    return [*optimized_tensors(optimizer), *model.buffers()]


def optimized_tensors(optimizer: torch.optim.Optimizer) -> list[Tensor]:
    """The optimizer's parameters, their gradients and its state."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = [t for s in optimizer.state.values() for t in s.values() if isinstance(t, Tensor)]
    return [*params, *(p.grad for p in params if p.grad is not None), *state]


def measure_training_step(step: Callable[[], None], resident: Callable[[], list[Tensor]] | None,
                          device: torch.device | str = "cpu", steps: int = 3, min_time_s: float = 0.0,
                          clock: Callable[[], float] = time.perf_counter) -> tuple[float, int]:
    """Mean seconds of ``step()`` (after one warm-up; at least ``steps`` calls and ``min_time_s`` seconds)
    and its peak memory in bytes.

    CUDA: the allocator's peak. CPU: the distinct storages of ``resident()`` plus the peak of the tensors
    autograd holds for backward at any one time (a lower bound of the process's peak; one more step), or 0 when
    ``resident`` is ``None``; steps are timed with the host memory kept as a CPU trial keeps it
    (:func:`hydro.trial.host_memory.keep_freed_memory`). ``clock``: as in :func:`time_layer`.
    """
    device = torch.device(device)
    if device.type == "cpu":
        keep_freed_memory()
    step()  # warm-up: allocates gradients and optimizer state
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start, calls = clock(), 0
    while calls < steps or clock() - start < min_time_s:
        step()
        calls += 1
        if device.type == "cuda" and calls >= steps:
            torch.cuda.synchronize(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        return (clock() - start) / calls, torch.cuda.max_memory_allocated(device)
    elapsed = (clock() - start) / calls
    if resident is None:  # time only: no step under the saved-tensor hooks
        return elapsed, 0
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in resident()}
    saved = _LiveSavedBytes(exclude=set(storages))
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t):
        step()
    return elapsed, sum(storages.values()) + saved.peak


class _LiveSavedBytes:
    """Peak bytes of the distinct storages autograd holds for backward at one time, ignoring ``exclude``."""

    def __init__(self, exclude: set[int]) -> None:
        self.peak, self._total, self._live, self._exclude = 0, 0, {}, exclude

    def pack(self, tensor: Tensor) -> Tensor:
        key = tensor.untyped_storage().data_ptr()
        if key in self._exclude:
            return tensor
        count, size = self._live.get(key, (0, tensor.untyped_storage().nbytes()))
        self._live[key] = (count + 1, size)
        if count == 0:
            self._total += size
            self.peak = max(self.peak, self._total)
        weakref.finalize(tensor, self._release, key)
        return tensor

    def _release(self, key: int) -> None:
        count, size = self._live[key]
        if count == 1:
            del self._live[key]
            self._total -= size
        else:
            self._live[key] = (count - 1, size)
