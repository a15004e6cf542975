"""Out of memory in a trial: the fused members that did not fit are split in two and the step retried for
them, so the trial goes on with every member training every batch (results as without the split); a budget
too small for one member fails naming the fix. The budget is injected (TuneSpec.memory_budget_bytes, counted on
CPU as resident tensors plus the activations autograd saves), standing in for a GPU's allocator limit."""
from __future__ import annotations

import pytest
import torch

from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.unit import FusedTrial, Gate
from tests.tune.workload import small_digits, spec

PLAN = TrialPlan(TrialKind.SURROGATE, [(f"m{i}", {"lr": 0.05 * (i + 1), "momentum": 0.9}) for i in range(4)])
FITS_TWO = 60_000  # bytes: 4 fused members of the 64-16-10 MLP at batch 32 need more, 2 need less
FITS_ONE = 40_000


def chunk_sizes(trial):
    return [len(chunk.member_ids) for chunk in trial.chunks]


def train(budget=None, epochs=2, precision="fp32"):
    trial = FusedTrial(spec(memory_budget_bytes=budget, precision=precision), PLAN, small_digits())
    return trial, [trial.run_epoch() for _ in range(epochs)]


@pytest.mark.parametrize("precision,budget,sizes", [("fp32", FITS_TWO, [2, 2]), ("fp32", FITS_ONE, [1, 1, 1, 1]),
                                                    ("fp16", FITS_ONE, [2, 2])])  # fp16 saves half-size activations
def test_members_over_the_budget_are_split_and_train_as_before(precision, budget, sizes):
    _, expected = train(precision=precision)
    trial, got = train(budget, precision=precision)
    assert chunk_sizes(trial) == sizes and trial.max_fusion == sizes[0]
    assert trial.member_ids == [m for m, _ in PLAN.members]
    for g, e in zip(got, expected):  # exact up to float32 rounding of other GEMM shapes
        for name in e:
            torch.testing.assert_close(g[name], e[name], rtol=1e-5, atol=1e-6)


def test_a_split_trial_checkpoints_restores_and_keeps_members_across_chunks():
    trial = FusedTrial(spec(memory_budget_bytes=FITS_TWO), PLAN, small_digits())
    for _ in range(3):
        trial.train_step()
    moved = FusedTrial(spec(), PLAN, small_digits())  # a fresh trial: one chunk until it loads the split state
    moved.load_state_dict(trial.state_dict())
    assert chunk_sizes(moved) == [2, 2]
    for t in (trial, moved):
        t.keep([1, 2])  # one member from each chunk
    assert chunk_sizes(trial) == [1, 1] and trial.member_ids == ["m1", "m2"]
    assert trial.max_fusion == moved.max_fusion == 2  # stopped members do not lower what fits
    want, got = trial.run_epoch(), moved.run_epoch()
    assert all(torch.equal(got[k], want[k]) for k in want)
    with pytest.raises(RuntimeError, match="split into 2 chunks.*FusedTrial.chunks"):
        trial.members


def test_a_budget_too_small_for_one_member_names_the_fix():
    with pytest.raises(torch.OutOfMemoryError, match="one member alone does not fit.*batch size or model"):
        train(budget=20_000, epochs=1)
    with pytest.raises(ValueError, match="memory budget must be > 0 bytes"):
        train(budget=0, epochs=1)


class CountingGate(Gate):
    """Counts forward calls of the trial's modules through hooks it installs."""

    def __init__(self):
        self.calls, self.handles = 0, []

    def attach(self, trial):
        self.handles = [m.register_forward_hook(self._count) for m in trial.modules()]

    def detach(self, trial):
        for handle in self.handles:
            handle.remove()
        self.handles = []

    def _count(self, module, inputs, output):
        self.calls += 1


def test_gates_move_to_the_chunks_of_a_split():
    gate = CountingGate()
    trial = FusedTrial(spec(memory_budget_bytes=FITS_TWO), PLAN, small_digits(), gates=[gate])
    trial.train_step()  # the 4-member model fails (one call), then both 2-member chunks train
    assert chunk_sizes(trial) == [2, 2] and len(gate.handles) == 2 and gate.calls == 3
    trial.train_step()
    assert gate.calls == 5


def test_a_cuda_budget_is_this_process_setting_and_a_later_trial_without_one_gets_the_old_one_back(monkeypatch):
    """Ray reuses actors: the allocator fraction a budgeted trial set must not limit the next trial of the
    process. The CUDA allocator calls are simulated (no GPU here); the GPU's own settings are never touched."""
    from hydro.trial import memory

    fractions = {0: 0.9}  # the process's own setting before any trial
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda index: fractions[index])
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction",
                        lambda fraction, index: fractions.__setitem__(index, fraction))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: type("P", (), {"total_memory": 1000}))
    monkeypatch.setattr(memory, "_FRACTION_BEFORE", {})
    memory.MemoryBudget(250, torch.device("cuda"))
    assert fractions == {0: 0.25}
    memory.MemoryBudget(500, torch.device("cuda:0"))  # the next trial's budget
    assert fractions == {0: 0.5}
    memory.MemoryBudget(None, torch.device("cuda"))  # a trial without a budget: the process's own setting
    assert fractions == {0: 0.9}
    memory.MemoryBudget(None, torch.device("cuda"))  # and nothing more
    assert fractions == {0: 0.9}


class LibraryAllocationFailure(Gate):
    """A forward hook that fails like cuBLAS/cuDNN failing to allocate (a plain RuntimeError, not
    torch.OutOfMemoryError) while more than ``fits`` members train fused."""

    def __init__(self, fits: int, message: str):
        self.fits, self.message, self.handles = fits, message, []

    def attach(self, trial):
        for chunk in trial.chunks:
            count = len(chunk.member_ids)
            for module in chunk.modules():
                self.handles.append(module.register_forward_hook(lambda *_, n=count: self._check(n)))

    def _check(self, count):
        if count > self.fits:
            raise RuntimeError(self.message)

    def detach(self, trial):
        for handle in self.handles:
            handle.remove()
        self.handles = []


@pytest.mark.parametrize("message", ["CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                                     "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
                                     "CUDA error: out of memory"])
def test_a_library_allocation_failure_splits_like_torchs_out_of_memory(message):
    _, expected = train(epochs=1)
    trial = FusedTrial(spec(), PLAN, small_digits(), gates=[LibraryAllocationFailure(2, message)])
    got = trial.run_epoch()
    assert chunk_sizes(trial) == [2, 2] and trial.max_fusion == 2
    for name in expected[0]:
        torch.testing.assert_close(got[name], expected[0][name], rtol=1e-5, atol=1e-6)


def test_other_runtime_errors_are_not_taken_for_out_of_memory():
    trial = FusedTrial(spec(), PLAN, small_digits(), gates=[LibraryAllocationFailure(2, "CUDA error: misaligned address")])
    with pytest.raises(RuntimeError, match="misaligned address"):
        trial.train_step()
    assert chunk_sizes(trial) == [4]


def test_a_split_that_does_not_fit_either_fails_naming_the_fix(monkeypatch):
    from hydro.trial.members import FusedMembers

    def no_memory(self, sizes):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")

    monkeypatch.setattr(FusedMembers, "split", no_memory)
    trial = FusedTrial(spec(memory_budget_bytes=FITS_TWO), PLAN, small_digits())
    with pytest.raises(torch.OutOfMemoryError, match="4 members ran out of memory.*splitting them does not fit"):
        trial.train_step()
    assert chunk_sizes(trial) == [4] and trial.step == 0  # nothing half-done: the batch was not counted


def test_a_gpu_share_leaves_the_cuda_context_out_of_the_budget():
    from hydro.trial.memory import CUDA_CONTEXT_BYTES, gpu_share_bytes

    assert gpu_share_bytes(0.25, 80 * 2**30) == 20 * 2**30 - CUDA_CONTEXT_BYTES
    assert 4 * (gpu_share_bytes(0.25, 80 * 2**30) + CUDA_CONTEXT_BYTES) <= 80 * 2**30  # four trials fit the card
    with pytest.raises(ValueError, match="no memory beyond the process's CUDA context"):
        gpu_share_bytes(0.05, 8 * 2**30)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        gpu_share_bytes(1.5, 8 * 2**30)


def test_moving_a_unit_takes_its_optimizer_state_along_and_names_what_it_moved():
    """What a GPU split stages in host memory and moves back: the modules, and the optimizer state that lived with
    them (by name, so that state kept elsewhere on purpose stays there on the way back)."""
    from hydro.trial.unit import _move

    trial = FusedTrial(spec(), PLAN, small_digits())
    trial.train_step()
    (chunk,) = trial.chunks
    moved = _move(chunk, torch.device("meta"))
    assert moved == {"momentum_buffer"}
    state = [t for s in chunk.optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor)]
    assert state and {t.device.type for t in [*chunk.model.parameters(), *state]} == {"meta"}
    assert _move(chunk, torch.device("meta"), keys=set()) == set()  # only the named entries move
