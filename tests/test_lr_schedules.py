"""TuneSpec.lr_scheduler and parameter groups of the optimizer factory: each member of a fused trial trains as it
would alone in plain torch with its own schedule and groups; what cannot be followed is refused clearly."""
import copy

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as ts

import hydro
from hydro.examples.data import digits
from hydro.examples.models import MLP
from hydro.trial.optimizer import ScheduleInOptimizerFactory, UnsupportedOptimizer
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.schedule import UnsupportedSchedule
from hydro.trial.spec import TuneSpec
from hydro.trial.unit import FusedTrial

CONFIGS = [{"lr": 0.05, "warmup": 3, "gamma": 0.9}, {"lr": 0.1, "warmup": 5, "gamma": 0.8},
           {"lr": 0.02, "warmup": 2, "gamma": 0.5}]
SCHEDULES = {
    "lambda-warmup": lambda o, c: ts.LambdaLR(o, lambda step: min(1.0, (step + 1) / c["warmup"])),
    "linear": lambda o, c: ts.LinearLR(o, start_factor=1 / c["warmup"], total_iters=c["warmup"]),
    "cosine": lambda o, c: ts.CosineAnnealingLR(o, T_max=4 * c["warmup"], eta_min=c["lr"] / 10),
    "step": lambda o, c: ts.StepLR(o, step_size=3, gamma=c["gamma"]),
    "multistep": lambda o, c: ts.MultiStepLR(o, milestones=[2, 5], gamma=c["gamma"]),
    "exponential": lambda o, c: ts.ExponentialLR(o, gamma=c["gamma"]),
    "onecycle": lambda o, c: ts.OneCycleLR(o, max_lr=2 * c["lr"], total_steps=20, cycle_momentum=False),
    "onecycle-3-linear": lambda o, c: ts.OneCycleLR(o, max_lr=c["lr"], total_steps=20, pct_start=0.25,
                                                    anneal_strategy="linear", three_phase=True,
                                                    cycle_momentum=False),
    "warmup-cosine": lambda o, c: ts.SequentialLR(o, [ts.LinearLR(o, start_factor=0.1, total_iters=c["warmup"]),
                                                      ts.CosineAnnealingLR(o, T_max=10)], milestones=[4]),
}
SGD = lambda params, c: torch.optim.SGD(params, lr=c["lr"], momentum=0.9)  # noqa: E731


def _data():
    train, val = digits()
    return (train.x[:192], train.y[:192]), (val.x[:64], val.y[:64])


def _spec(**kwargs) -> TuneSpec:
    options = dict(model=lambda c: MLP((64, 32, 10)), data=_data, loss=nn.CrossEntropyLoss(), optimizer=SGD,
                   epochs=3, batch_size=32)
    return TuneSpec(**{**options, **kwargs})


def _trial(spec: TuneSpec, fused: bool = True) -> FusedTrial:
    plan = TrialPlan(TrialKind.SURROGATE if fused else TrialKind.PLAIN, [(f"m{i}", c) for i, c in enumerate(CONFIGS)])
    return FusedTrial(spec, plan, spec.data(), device="cpu")


def _alone(spec: TuneSpec, trial: FusedTrial, epochs: int) -> list[nn.Module]:
    """Each member of ``trial`` (before it trains) trained alone in plain torch on the trial's batches."""
    models = hydro.unfuse(trial.members.model)
    opts = [spec.optimizer(m.parameters(), c) for m, c in zip(models, CONFIGS)]
    scheds = [spec.lr_scheduler(o, c) for o, c in zip(opts, CONFIGS)] if spec.lr_scheduler else []
    for epoch in range(1, epochs + 1):
        for x, y in trial.data[0].train_batches(spec.batch_size, spec.seed, epoch, 0, torch.device("cpu")):
            for model, opt in zip(models, opts):
                opt.zero_grad()
                spec.loss(model(x), y).backward()
                opt.step()
            if spec.lr_scheduler_interval.value == "batch":
                for s in scheds:
                    s.step()
        if spec.lr_scheduler_interval.value == "epoch":
            for s in scheds:
                s.step()
    return models


def _assert_trial_equals_alone(spec: TuneSpec, epochs: int = 3) -> None:
    trial = _trial(spec)
    alone = _alone(spec, trial, epochs)
    for _ in range(epochs):
        trial.run_epoch()
    for member, ref in zip(hydro.unfuse(trial.members.model), alone):
        for (name, a), b in zip(member.named_parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("interval", ["batch", "epoch"])
def test_each_member_follows_its_torch_schedule(name, interval):
    _assert_trial_equals_alone(_spec(lr_scheduler=SCHEDULES[name], lr_scheduler_interval=interval))


def test_parameter_groups_of_the_factory_are_kept_per_member():
    """AdamW without weight decay on biases (1-d parameters), per-member lr and decay, and a scheduled warm-up."""
    def adamw(params, c):
        params = list(params)
        return torch.optim.AdamW([{"params": [p for p in params if p.ndim >= 2], "weight_decay": c["gamma"] / 10},
                                  {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0,
                                   "lr": c["lr"] / 2}], lr=c["lr"] / 10)
    _assert_trial_equals_alone(_spec(optimizer=adamw, lr_scheduler=SCHEDULES["warmup-cosine"],
                                     lr_scheduler_interval="batch"))
    trial = _trial(_spec(optimizer=adamw))
    assert len(trial.members.optimizer.param_groups) == 2


def test_reduce_on_plateau_follows_each_members_metric():
    """Per member, the fused ReduceLROnPlateau makes torch's decisions on the member's own metric values."""
    fused = hydro.fuse([nn.Linear(3, 2) for _ in range(3)])
    optimizer = hydro.optim.SGD(fused.parameters(), lr=[0.1, 0.2, 0.3])
    plateau = hydro.optim.lr_scheduler.ReduceLROnPlateau(optimizer, "min", factor=[0.5, 0.1, 0.9], patience=1,
                                                         min_lr=[0.0, 0.05, 0.0], cooldown=1)
    refs = [ts.ReduceLROnPlateau(torch.optim.SGD(nn.Linear(3, 2).parameters(), lr=lr), "min", factor=f,
                                 patience=1, min_lr=m, cooldown=1)
            for lr, f, m in ((0.1, 0.5, 0.0), (0.2, 0.1, 0.05), (0.3, 0.9, 0.0))]
    g = torch.Generator().manual_seed(0)
    for _ in range(12):
        metrics = torch.rand(3, generator=g, dtype=torch.float64)
        plateau.step(metrics)
        for ref, value in zip(refs, metrics.tolist()):
            ref.step(value)
        expected = [ref.optimizer.param_groups[0]["lr"] for ref in refs]
        assert plateau.get_last_lr()[0].tolist() == expected


def test_reduce_on_plateau_in_a_trial_equals_plain_members():
    """In a trial, on each member's val_loss: fused equals the members trained unfused with torch's scheduler."""
    spec = _spec(lr_scheduler=lambda o, c: ts.ReduceLROnPlateau(o, factor=c["gamma"], patience=0, threshold=0.5))
    trials = [_trial(spec, fused) for fused in (True, False)]
    trials[1].chunks[0].models = [copy.deepcopy(m) for m in hydro.unfuse(trials[0].members.model)]
    trials[1].chunks[0].opts = [SGD(m.parameters(), c) for m, c in zip(trials[1].chunks[0].models, CONFIGS)]
    trials[1].chunks[0].scheds = [spec.lr_scheduler(o, c) for o, c in zip(trials[1].chunks[0].opts, CONFIGS)]
    for _ in range(3):
        for trial in trials:
            trial.run_epoch()
    lrs = trials[0].members.optimizer.param_groups[0]["lr"].tolist()
    assert lrs == [o.param_groups[0]["lr"] for o in trials[1].chunks[0].opts]
    assert lrs != [c["lr"] for c in CONFIGS]  # it reduced


def test_schedules_and_groups_that_cannot_be_followed_are_refused():
    def scheduled_in_factory(params, c):
        optimizer = torch.optim.SGD(params, lr=c["lr"])
        ts.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
        return optimizer

    with pytest.raises(ScheduleInOptimizerFactory, match=r"created an LR scheduler \(torch.optim.lr_scheduler.LambdaLR"
                                                         r"\).*Fix:.*TuneSpec\(lr_scheduler="):
        _trial(_spec(optimizer=scheduled_in_factory))
    with pytest.raises(ScheduleInOptimizerFactory):  # unfused fallback members too: nothing would step it
        _trial(_spec(optimizer=scheduled_in_factory), fused=False)
    with pytest.raises(UnsupportedSchedule, match="returned torch.optim.lr_scheduler.CyclicLR; fused training "
                                                  "supports"):
        _trial(_spec(lr_scheduler=lambda o, c: ts.CyclicLR(o, 0.01, 0.1)))
    with pytest.raises(UnsupportedSchedule, match="OneCycleLR with cycle_momentum=True.*cycle_momentum=False"):
        _trial(_spec(lr_scheduler=lambda o, c: ts.OneCycleLR(o, max_lr=0.1, total_steps=20)))
    with pytest.raises(UnsupportedSchedule, match="members differ in StepLR.step_size"):
        _trial(_spec(lr_scheduler=lambda o, c: ts.StepLR(o, step_size=c["warmup"])))
    with pytest.raises(UnsupportedSchedule, match="lr_scheduler_interval='epoch'"):
        _trial(_spec(lr_scheduler=lambda o, c: ts.ReduceLROnPlateau(o), lr_scheduler_interval="batch"))
    with pytest.raises(UnsupportedOptimizer, match="groups the parameters differently.*group_by"):
        _trial(_spec(optimizer=lambda params, c: torch.optim.SGD(
            [{"params": [p]} for p in params] if c["lr"] > 0.06 else params, lr=c["lr"])))
    with pytest.raises(TypeError, match=r"TuneSpec.lr_scheduler is called as lr_scheduler\(optimizer, config\), "
                                        r"got CosineAnnealingLR"):
        _spec(lr_scheduler=ts.CosineAnnealingLR)
    with pytest.raises(ValueError, match=r"lr_scheduler_interval must be one of \['batch', 'epoch'\], got 'step'"):
        _spec(lr_scheduler_interval="step")


def test_trials_with_schedules_merge_and_go_on_as_one():
    """Survivors of two fused trials continue as one (hydro.trial.merge): their schedules' state merges too."""
    from hydro.trial.merge import merge_states

    spec = _spec(lr_scheduler=SCHEDULES["warmup-cosine"], lr_scheduler_interval="batch")
    parts = [FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, [(f"m{i}", CONFIGS[i]) for i in ids]), spec.data(),
                        device="cpu") for ids in ([0], [1, 2])]
    for part in parts:
        part.run_epoch()
    merged, reference = _trial(spec), _trial(spec)
    merged.load_state_dict(merge_states([part.state_dict() for part in parts]))
    merged.run_epoch()
    for _ in range(2):
        reference.run_epoch()
    assert merged.members.scheduler.last_epoch == reference.members.scheduler.last_epoch
    torch.testing.assert_close(merged.members.optimizer.param_groups[0]["lr"],
                               reference.members.optimizer.param_groups[0]["lr"])
    for a, b in zip(merged.members.model.parameters(), reference.members.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
