"""A trial's data splits as batch sources: in-memory tensors (the fast path: moved to the trial's device once),
map-style ``Dataset``s, iterable ``Dataset``s, or a map-style dataset with the user's own ``DataLoader``
(:class:`LoaderFactory`).

Every member of a fused trial trains on the same batch (one load for F models). Training batches follow
:func:`batch_order` of (seed, epoch) wherever the source allows it (tensors, map-style datasets, loader
factories), so a retried or restored trial replays exactly, and the three give the same batches bit for bit;
an iterable dataset is batched in its own order (its ``set_epoch(epoch)`` is called when it has one). A
``TensorDataset`` of (inputs, targets) is taken as its tensors (the same batches, without a loader).

In-memory splits moved to a GPU stay there for the process's next trials of the same splits (:func:`on_device`):
Ray runs a run's trials one after another in the same worker processes.
"""
from __future__ import annotations

import itertools
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

Batch = tuple[Tensor, Tensor]
EVAL_BATCH = 256  # on a CPU, validation batches hold at least this many samples
RESIDENT_SHARE = 0.25  # in-memory splits stay on a GPU between trials while they take at most this share of it


def eval_batch_size(batch_size: int, device: torch.device) -> int:
    """Validation batch size of a trial training batches of ``batch_size`` on ``device``: on a GPU the training
    batch size (evaluation then runs at the shapes training already ran: no new cuDNN algorithm searches), on a
    CPU at least ``EVAL_BATCH`` (fewer, larger batches)."""
    return batch_size if device.type == "cuda" else max(batch_size, EVAL_BATCH)


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The CPU generator of ``epoch`` (1-based): everything random about an epoch's data derives from it."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


def batch_order(seed: int, epoch: int, size: int) -> Tensor:
    """Sample order of ``epoch`` (1-based) over a split of ``size`` samples: a function of (seed, epoch)."""
    return torch.randperm(size, generator=epoch_generator(seed, epoch))


@dataclass
class LoaderFactory:
    """A map-style ``dataset`` with the user's own loader: ``make(dataset, batch_size, sampler)`` returns an
    iterable of ``(inputs, targets)`` batches in ``sampler``'s order, e.g.
    ``DataLoader(dataset, batch_size, sampler=sampler, num_workers=4, collate_fn=...)`` (Hydro's sampler makes
    the order a function of (seed, epoch))."""

    dataset: Dataset
    make: Callable[[Dataset, int, Sequence[int]], Iterable]


class DataSource(ABC):
    """One split, batched for a trial. Batches come on ``device`` (pinned and copied ``non_blocking`` on CUDA)."""

    def num_batches(self, batch_size: int) -> int | None:
        """Training batches per epoch (``None``: unknown until the split is read, iterable datasets)."""
        return None

    @abstractmethod
    def train_batches(self, batch_size: int, seed: int, epoch: int, start: int, device: torch.device
                      ) -> Iterator[Batch]:
        """The training batches of ``epoch`` from the ``start``-th on."""

    @abstractmethod
    def eval_batches(self, batch_size: int, device: torch.device) -> Iterator[Batch]:
        """The whole split in its stored order."""

    def to(self, device: torch.device) -> DataSource:
        """This source for training on ``device`` (tensors move there once; the others load per batch)."""
        return self

    def sample(self, size: int) -> Batch:
        """The first ``size`` samples (CPU or where they are): e.g. one batch to plan fusion with."""
        return next(self.eval_batches(size, torch.device("cpu")))


class TensorSource(DataSource):
    """In-memory ``(inputs [N, ...], targets [N, ...])``: batches are index selections on the device."""

    def __init__(self, x: Tensor, y: Tensor, key: str | None = None) -> None:
        if len(x) != len(y):
            raise ValueError(f"hydro.trial.data: inputs hold {len(x)} samples but targets {len(y)}; pass "
                             f"(inputs [N, ...], targets [N, ...]) of the same N")
        self.x, self.y = x, y
        self.key = key or uuid.uuid4().hex  # the same in every copy of this source (pickled to Ray's workers)

    def __len__(self) -> int:
        return len(self.y)

    @property
    def nbytes(self) -> int:
        return self.x.nbytes + self.y.nbytes

    def num_batches(self, batch_size: int) -> int:
        return -(-len(self) // batch_size)

    def to(self, device: torch.device) -> TensorSource:
        return self if self.x.device == device else TensorSource(self.x.to(device), self.y.to(device), self.key)

    def train_batches(self, batch_size, seed, epoch, start, device):
        order = batch_order(seed, epoch, len(self))
        if self.x.device.type == "cuda":  # the epoch's order copied once, without waiting for the device
            order = order.pin_memory().to(self.x.device, non_blocking=True)
        for index in order.split(batch_size)[start:]:
            yield _on(self.x[index], device), _on(self.y[index], device)

    def eval_batches(self, batch_size, device):
        for start in range(0, len(self), batch_size):
            yield _on(self.x[start:start + batch_size], device), _on(self.y[start:start + batch_size], device)


class DatasetSource(DataSource):
    """A map-style ``Dataset`` of ``(input, target)`` samples, loaded by a ``DataLoader`` with ``workers``
    worker processes; with a ``make`` (:class:`LoaderFactory`) the user's loader instead."""

    def __init__(self, dataset: Dataset, workers: int = 0,
                 make: Callable[[Dataset, int, Sequence[int]], Iterable] | None = None) -> None:
        self.dataset, self.workers, self.make = dataset, workers, make

    def __len__(self) -> int:
        return len(self.dataset)

    def num_batches(self, batch_size: int) -> int:
        return -(-len(self) // batch_size)

    def train_batches(self, batch_size, seed, epoch, start, device):
        order = batch_order(seed, epoch, len(self))[start * batch_size:].tolist()
        return self._load(order, batch_size, device, epoch_generator(seed, epoch))

    def eval_batches(self, batch_size, device):
        return self._load(range(len(self)), batch_size, device, torch.Generator().manual_seed(0))

    def _load(self, order: Sequence[int], batch_size: int, device: torch.device, generator: torch.Generator
              ) -> Iterator[Batch]:
        if self.make is not None:
            loader = self.make(self.dataset, batch_size, order)
        else:  # the generator seeds the workers: the global RNG (dropout) stays untouched
            loader = DataLoader(self.dataset, batch_size, sampler=order, num_workers=self.workers,
                                pin_memory=device.type == "cuda", generator=generator)
        with torch.random.fork_rng(devices=[]):  # a user's loader may draw its workers' seed from the global RNG
            batches = iter(loader)
        return (_batch_on(batch, device) for batch in batches)


class IterableSource(DataSource):
    """An ``IterableDataset`` of ``(input, target)`` samples, batched in its own order."""

    def __init__(self, dataset: IterableDataset, workers: int = 0) -> None:
        self.dataset, self.workers = dataset, workers

    def train_batches(self, batch_size, seed, epoch, start, device):
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        return itertools.islice(self.eval_batches(batch_size, device), start, None)

    def eval_batches(self, batch_size, device):
        loader = DataLoader(self.dataset, batch_size, num_workers=self.workers, pin_memory=device.type == "cuda")
        with torch.random.fork_rng(devices=[]):
            batches = iter(loader)
        return (_batch_on(batch, device) for batch in batches)


def as_source(split, name: str, workers: int = 0) -> DataSource:
    """A split of ``TuneSpec.data()`` as a :class:`DataSource`: ``(inputs, targets)`` tensors or an object with
    ``.x``/``.y``, a map-style or iterable ``Dataset``, or a :class:`LoaderFactory`."""
    if isinstance(split, DataSource):
        source = split
    elif isinstance(split, TensorDataset) and len(split.tensors) == 2:
        source = TensorSource(*split.tensors)
    elif isinstance(split, IterableDataset):
        source = IterableSource(split, workers)
    elif isinstance(split, Dataset):
        source = DatasetSource(split, workers)
    elif isinstance(split, LoaderFactory):
        source = DatasetSource(split.dataset, make=split.make)
    elif hasattr(split, "x") and hasattr(split, "y"):
        source = TensorSource(split.x, split.y)
    elif isinstance(split, (tuple, list)) and len(split) == 2 and all(isinstance(t, Tensor) for t in split):
        source = TensorSource(*split)
    else:
        raise ValueError(f"hydro.trial.data: the {name} split of TuneSpec.data() must be (inputs, targets) tensors, "
                         f"an object with .x/.y, a torch Dataset or a LoaderFactory; got {type(split).__name__}")
    if source.num_batches(1) == 0:  # (None: an iterable dataset, its length unknown)
        raise ValueError(f"hydro.trial.data: the {name} split of TuneSpec.data() holds no samples")
    return source


_RESIDENT: dict[tuple[str, torch.device], TensorSource] = {}  # the splits of this process's last GPU trial


def on_device(sources: Sequence[DataSource], device: torch.device, budget_bytes: int | None = None
              ) -> list[DataSource]:
    """``sources`` for training on ``device``. On a GPU, in-memory splits (:class:`TensorSource`) that together
    take at most ``RESIDENT_SHARE`` of ``budget_bytes`` (the trial's memory; ``None``: the device's) stay there
    for this process's next trials: a later trial of the same splits (the same ``key``) trains on them without
    copying them again. Only the last trial's splits stay (a trial of other splits releases them first)."""
    keys = {(source.key, device) for source in sources if isinstance(source, TensorSource)}
    for key in [key for key in _RESIDENT if key not in keys]:
        del _RESIDENT[key]
    moved = [_RESIDENT[source.key, device] if isinstance(source, TensorSource) and (source.key, device) in _RESIDENT
             else source.to(device) for source in sources]
    if device.type == "cuda":
        limit = budget_bytes if budget_bytes is not None else torch.cuda.get_device_properties(device).total_memory
        resident = [source for source in moved if isinstance(source, TensorSource)]
        if sum(source.nbytes for source in resident) <= RESIDENT_SHARE * limit:
            _RESIDENT.update(((source.key, device), source) for source in resident)
    return moved


def _on(tensor: Tensor, device: torch.device) -> Tensor:
    return tensor.to(device, non_blocking=True)


def _batch_on(batch, device: torch.device) -> Batch:
    if not isinstance(batch, (tuple, list)) or len(batch) != 2:
        raise ValueError(f"hydro.trial.data: a batch must be (inputs, targets), got {type(batch).__name__}"
                         f"{f' of {len(batch)}' if isinstance(batch, (tuple, list)) else ''}; return "
                         f"(input, target) pairs from the dataset (or batches of them from the loader)")
    return _on(batch[0], device), _on(batch[1], device)
