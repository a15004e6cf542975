"""A fused trial trains, checkpoints and restores without importing ``torch._dynamo`` (about 1 s in every new trial
process and in the driver's check), and torch's guards against tracing are back as soon as it is loaded. Each case
runs in a fresh interpreter: the test process has usually loaded ``torch._dynamo`` already."""
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_fused_trial_never_imports_torch_dynamo():
    out = _run("""
        import sys
        import torch
        from torch import nn
        from hydro.optim.dynamo_guard import GUARDED
        from hydro.trial.check import check_member
        from hydro.trial.plan import TrialKind, TrialPlan
        from hydro.trial.spec import TuneSpec, accuracy
        from hydro.trial.unit import FusedTrial
        from tests.digits import mlp, small_digits

        spec = TuneSpec(model=mlp, data=small_digits, loss=nn.CrossEntropyLoss(), metric="val_acc", mode="max",
                        optimizer=lambda p, c: torch.optim.AdamW(p, lr=c["lr"], weight_decay=c["wd"]),
                        metrics={"val_acc": accuracy}, epochs=1, batch_size=32)
        configs = [{"lr": 1e-3, "wd": 0.0}, {"lr": 1e-2, "wd": 0.1}]
        assert check_member(spec, configs[0]) is None
        plan = TrialPlan(TrialKind.SURROGATE, [("a", configs[0]), ("b", configs[1])], 2, True)
        trial = FusedTrial(spec, plan, small_digits())
        trial.train_epoch()
        twin = FusedTrial(spec, plan, small_digits())
        twin.load_state_dict(trial.state_dict())
        assert all(torch.equal(p, q) for p, q in zip(trial.modules()[0].parameters(), twin.modules()[0].parameters()))
        leftovers = [n for n in GUARDED if hasattr(getattr(torch.optim.Optimizer, n).__wrapped__, "__dynamo_disable")]
        print("torch._dynamo" in sys.modules, leftovers)
    """)
    assert out == "False []", "a fused trial imported torch._dynamo (or left the guard's cache set): " + out


def test_the_guards_act_as_torch_wrote_them_once_torch_dynamo_is_loaded():
    out = _run("""
        import sys
        import torch
        from hydro.optim import SGD
        from hydro.optim.dynamo_guard import GUARDED, optimizers_unguarded, unguarded

        before = [unguarded(n) is getattr(torch.optim.Optimizer, n).__wrapped__ for n in GUARDED]
        with optimizers_unguarded():
            torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        inside = "torch._dynamo" in sys.modules
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # outside: torch's own path, which loads it
        cached = getattr(torch.optim.Optimizer.add_param_group.__wrapped__, "__dynamo_disable")
        after = [unguarded(n) is getattr(torch.optim.Optimizer, n) for n in GUARDED]

        weight = torch.nn.Parameter(torch.ones(2, 3))
        optimizer = SGD([weight], lr=[0.1, 0.2])
        weight.sum().backward()
        compiled = torch.compile(lambda: optimizer.zero_grad(), backend="eager")
        compiled()
        print(all(before), inside, cached is not torch.optim.Optimizer.add_param_group.__wrapped__, all(after),
              weight.grad is None)
    """)
    assert out == "True False True True True", out
