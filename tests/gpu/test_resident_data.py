"""In-memory splits stay on the GPU between a process's trials of the same splits (skipped without CUDA; on a CPU
nothing is kept: tests/test_data_sources.py)."""
import pickle

import pytest
import torch

from hydro.trial import data as data_module
from hydro.trial.data import as_source, on_device
from tests.digits import small_digits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_later_trial_of_the_same_splits_trains_on_the_copy_already_on_the_gpu():
    cuda = torch.device("cuda", torch.cuda.current_device())
    splits = [as_source(split, name) for split, name in zip(small_digits(), ("train", "val"))]
    first = on_device(splits, cuda)
    again = on_device([pickle.loads(pickle.dumps(s)) for s in splits], cuda)  # the next trial's copy from Ray
    assert [s.x.data_ptr() for s in again] == [s.x.data_ptr() for s in first]
    assert torch.equal(again[0].x.cpu(), splits[0].x)
    other = on_device([as_source(small_digits()[0], "train")], cuda)  # other splits release the first trial's
    assert set(data_module._RESIDENT) == {(other[0].key, cuda)}
    on_device(splits, cuda, budget_bytes=splits[0].nbytes)  # more than RESIDENT_SHARE of the trial's memory
    assert not data_module._RESIDENT
