"""A CPU trial keeps the host memory its steps free (``hydro.trial.host_memory``): a fused step's large
activation blocks are reused by the next step instead of being faulted in anew from the system."""
import subprocess
import sys
import textwrap

import hydro.profiling as profiling
import hydro.trial.unit as unit
from hydro.trial.host_memory import keep_freed_memory
from hydro.trial.plan import TrialKind, TrialPlan
from tests.conftest import REPO
from tests.tune.workload import spec

# A fused step of 12 small CNNs (the digits CNN's surrogates at scale 8: 32 and 64 channels): the median page
# faults of a step with glibc's default thresholds, then after keep_freed_memory() in the same process (a step
# still faults in now and then while the heap grows to fit a step).
_FUSED_STEPS = textwrap.dedent("""
    import resource, statistics, torch
    import hydro
    from hydro.examples.models import CNN
    from hydro.trial.host_memory import keep_freed_memory

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = hydro.fuse([CNN(channels=(32, 64)) for _ in range(12)])
    x = torch.rand(64, 1, 8, 8)

    def faults():
        start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model(x).logsumexp(-1).sum().backward()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start

    def median_faults(steps=12):
        return statistics.median([faults() for _ in range(2 + steps)][2:])  # after 2 warm-up steps

    before = median_faults()
    kept = keep_freed_memory()
    print(before, median_faults(), kept)
""")


def test_kept_memory_stops_the_page_faults_of_fused_steps():
    out = subprocess.run([sys.executable, "-c", _FUSED_STEPS], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}).stdout.split()
    before, after, kept = float(out[0]), float(out[1]), out[2] == "True"
    if not kept:  # not glibc: nothing changed, nothing to compare
        assert not keep_freed_memory()
        return
    assert before > 1000, f"expected a fused step to fault memory in with malloc's defaults, got a median of {before}"
    assert after < before / 10, f"a fused step still faults a median of {after} pages in (before: {before})"


def test_a_cpu_trial_keeps_freed_memory(monkeypatch):
    calls = []
    monkeypatch.setattr(unit, "keep_freed_memory", lambda: calls.append(True) or True)
    workload = spec()
    configs = [(f"m{i}", {"lr": 0.1, "momentum": 0.9}) for i in range(2)]
    unit.FusedTrial(workload, TrialPlan(TrialKind.SURROGATE, configs), workload.load_data(), device="cpu")
    assert calls == [True]


def test_cpu_step_timings_keep_freed_memory_as_trials_do(monkeypatch):
    """The fusion planner's and the profiler's CPU step timings run under the allocator settings trials train in."""
    calls = []
    monkeypatch.setattr(profiling, "keep_freed_memory", lambda: calls.append(True) or True)
    steps = []
    elapsed, _ = profiling.measure_training_step(lambda: steps.append(1), None, "cpu", steps=2)
    assert calls == [True] and len(steps) == 3 and elapsed >= 0
