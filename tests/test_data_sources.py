"""TuneSpec.data splits beyond in-memory tensors: map-style Datasets (in the trial or in worker processes), a
LoaderFactory with the user's own DataLoader, and an iterable Dataset train the members exactly as the tensor
path does (weights equal bit for bit after 2 epochs), and a trial restored mid-epoch replays exactly."""
from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, TensorDataset

from hydro.trial import data as data_module
from hydro.trial.data import DatasetSource, LoaderFactory, TensorSource, as_source, batch_order, on_device
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial
from tests.tune.workload import small_digits, spec

PLAN = TrialPlan(TrialKind.SURROGATE, [("a", {"lr": 0.1, "momentum": 0.9}), ("b", {"lr": 0.03, "momentum": 0.0})])
SEED = 5


class Samples(Dataset):
    """A user's map-style dataset: one (input, target) per index, from numpy as a file reader would give."""

    def __init__(self, x, y):
        self.x, self.y = x.numpy(), y.numpy()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return torch.from_numpy(self.x[i]), int(self.y[i])


class Stream(IterableDataset):
    """A user's iterable dataset that shuffles per epoch itself (set_epoch, as DistributedSampler users do)."""

    def __init__(self, x, y, shuffle: bool):
        self.x, self.y, self.shuffle, self.epoch = x, y, shuffle, None

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        order = batch_order(SEED, self.epoch, len(self.y)) if self.shuffle else range(len(self.y))
        return ((self.x[i], self.y[i]) for i in order)


def my_loader(dataset, batch_size, sampler):
    return DataLoader(dataset, batch_size, sampler=sampler, num_workers=0)


def splits(kind: str):
    (x, y), (vx, vy) = small_digits()
    if kind == "tensors":
        return (x, y), (vx, vy)
    if kind in ("dataset", "dataset-workers"):
        return Samples(x, y), Samples(vx, vy)
    if kind == "loader-factory":
        return LoaderFactory(Samples(x, y), my_loader), LoaderFactory(Samples(vx, vy), my_loader)
    return Stream(x, y, shuffle=True), Stream(vx, vy, shuffle=False)


def trained(kind: str):
    workload = spec(epochs=2, seed=SEED, data_workers=2 if kind == "dataset-workers" else 0)
    trial = FusedTrial(workload, PLAN, splits(kind))
    metrics = [trial.run_epoch() for _ in range(2)]
    return trial, metrics


def test_dataset_loader_and_iterable_splits_train_exactly_like_tensors():
    reference, expected = trained("tensors")
    weights = reference.members.model.state_dict()
    for kind in ("dataset", "dataset-workers", "loader-factory", "iterable"):
        trial, metrics = trained(kind)
        for name, value in trial.members.model.state_dict().items():
            assert torch.equal(value, weights[name]), (kind, name)
        for got, want in zip(metrics, expected):
            assert all(torch.equal(got[k], want[k]) for k in want), kind
    assert reference.data_wait_s > 0 and reference.train_s > reference.data_wait_s


@pytest.mark.parametrize("kind", ["dataset", "iterable"])
def test_a_trial_restored_mid_epoch_replays_exactly(kind):
    _, expected = trained(kind)
    workload = spec(epochs=2, seed=SEED)
    first = FusedTrial(workload, PLAN, splits(kind))
    for _ in range(4):
        first.train_step()
    moved = FusedTrial(workload, PLAN, splits(kind))
    moved.load_state_dict(first.state_dict())
    assert moved.steps_per_epoch == (10 if kind == "dataset" else None)
    for want in expected:
        got = moved.run_epoch()
        assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_tensor_dataset_trains_as_its_tensors_bit_for_bit_without_a_loader(monkeypatch):
    (x, y), (vx, vy) = small_digits()
    workload = spec(epochs=2, seed=SEED)
    loaded = FusedTrial(workload, PLAN, (DatasetSource(TensorDataset(x, y)), DatasetSource(TensorDataset(vx, vy))))
    expected = [loaded.run_epoch() for _ in range(2)]  # a DataLoader per epoch and per evaluation
    built = []
    monkeypatch.setattr(data_module, "DataLoader", lambda *args, **kwargs: built.append(args) or DataLoader(*args,
                                                                                                           **kwargs))
    trial = FusedTrial(workload, PLAN, (TensorDataset(x, y), TensorDataset(vx, vy)))
    metrics = [trial.run_epoch() for _ in range(2)]
    assert all(isinstance(source, TensorSource) for source in trial.data) and not built
    weights = loaded.members.model.state_dict()
    assert all(torch.equal(value, weights[name]) for name, value in trial.members.model.state_dict().items())
    assert all(torch.equal(got[k], want[k]) for got, want in zip(metrics, expected) for k in want)


def test_an_in_memory_split_keeps_its_key_when_pickled_or_moved_and_stays_nowhere_on_a_cpu():
    source = as_source(small_digits()[0], "train")
    assert pickle.loads(pickle.dumps(source)).key == source.key  # a Ray worker's copy of the driver's split
    assert source.to(torch.device("meta")).key == source.key
    assert as_source(small_digits()[0], "train").key != source.key  # loaded again: another split
    assert on_device([source], torch.device("cpu"))[0] is source and not data_module._RESIDENT


def test_bad_splits_and_batches_name_the_fix():
    with pytest.raises(ValueError, match="train split of TuneSpec.data.*Dataset or a LoaderFactory; got int"):
        spec(data=lambda: (3, small_digits()[1])).load_data()

    class Triples(Samples):
        def __getitem__(self, i):
            return (*super().__getitem__(i), 0)

    (x, y), val = small_digits()
    with pytest.raises(ValueError, match="a batch must be \\(inputs, targets\\), got list of 3"):
        FusedTrial(spec(), PLAN, (Triples(x, y), val)).train_step()
