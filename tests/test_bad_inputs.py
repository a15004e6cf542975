"""The bad-input census: bad inputs a user can give Hydro's public surface
without a Ray cluster, each refused with one clear error before work starts.

How to read it: every row of ``CASES`` (Python API, by area) and ``CLI_CASES`` (``hydro`` command lines) is one bad
input: its name, what triggers it, the exception it must raise and a piece of the message that names the offending
argument or value (most also name the fix). ``test_api_refuses`` checks the type, the piece, and that the error is
Hydro's own (raised in ``hydro/`` or ``schedulers/``, not an internal ``AssertionError``/``KeyError``/... nor a
message from deep inside torch); ``test_cli_refuses`` checks exit code 2, the piece in one stderr line (after
argparse's usage for argparse's own errors), no traceback, and that Ray did not start. Rows marked ``# fixed``
were silent (no error anywhere before tuning: wrong results or wasted work), unclear (a traceback, an internal
error, a message that named neither the problem nor the fix; for a ``TuneSpec`` field accepted as given, what
``prepare`` then said) or late (clear, but after Ray had started) when the census was taken, and were fixed with it.

Counts: 257 bad inputs tried (207 API, 50 CLI), 118 of them marked ``# fixed``; 0 silent or unclear now. Blocks
at the end of each list, each under a comment naming its area, were added with later features and fault work.
"""
from __future__ import annotations

import math
import traceback
from pathlib import Path

import pytest
import ray
import torch
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining
from torch import nn

import hydro
from hydro.pipeline import PipelineSpec, one_f_one_b
from hydro.cli import main
from hydro.energy.tuning import EnergySettings
from hydro.examples.models import MLP
from hydro.optim import SGD, Adam, AdamW, clip_grad_norm_
from hydro.optim import lr_scheduler as sched
from hydro.trial.check import WorkloadError
from hydro.tune import HydroSearcher, accuracy
from hydro.tune.energy.scheduler import EnergyScheduler, for_hydro
from hydro.tune.pipeline.job import PipelineJob
from hydro.tune.pipeline.stage_energy import FillRate
from hydro.tune.run import check_arguments, fit, prepare
from schedulers.member_stopping import ASHA, ConvergenceStopping
from schedulers.pipeline_energy import FillValue
from tests.tune import fault_workloads as FAULTS
from tests.tune import real_workloads
from tests.tune.workload import SPACE, spec

REPO = Path(__file__).resolve().parents[1]
FAULT_WORKLOADS = REPO / "tests" / "tune" / "fault_workloads.py"
OWN_CODE = (str(REPO / "hydro"), str(REPO / "schedulers"))
INTERNAL = (AssertionError, AttributeError, IndexError, KeyError, StopIteration, ZeroDivisionError)


def fused(members: int = 3) -> hydro.FusedModel:
    torch.manual_seed(0)
    return hydro.fuse([MLP((8, 4, 2)) for _ in range(members)])


def sgd(**kwargs) -> SGD:
    return SGD(fused().parameters(), **{"lr": 0.1, **kwargs})


def with_grads(model: nn.Module):
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    return model.parameters()


def keep_with(optimizer=None, schedulers=()):
    """``keep_members([0])`` of a fused model with ``optimizer``/``schedulers`` (callables of that model)."""
    model = fused()
    opt = optimizer(model) if optimizer else None
    hydro.keep_members(model, [0], opt, [make(model, opt) for make in schedulers])


def split(n: int = 16):
    """``n`` samples of 8 features and 2 classes."""
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 8, generator=g), torch.randint(0, 2, (n,), generator=g)


def plan(**kwargs):
    return hydro.plan_fusion(lambda: MLP((8, 4, 2)), split(4), nn.CrossEntropyLoss(), **{"max_members": 2, **kwargs})


def energy(**kwargs) -> EnergySettings:
    return EnergySettings("unused.db", "job", **kwargs)


def searcher(*args, **kwargs) -> HydroSearcher:
    return HydroSearcher(spec(), *args, **{"num_samples": 4, **kwargs})


def case(name, trigger, error, match):
    return pytest.param(trigger, error, match, id=name)


CASES = [
    # --- hydro.fuse / unfuse / keep_members --------------------------------------------------------------------
    case("fuse-empty", lambda: hydro.fuse([]), hydro.FuseError, "needs at least one model, got an empty sequence"),
    case("fuse-not-a-module", lambda: hydro.fuse([MLP(), "MLP"]), hydro.FuseError, "member 1 is a str"),
    case("fuse-one-model-not-a-list", lambda: hydro.fuse(MLP()), hydro.FuseError,  # fixed
         "takes a list of models, got one MLP"),
    case("fuse-different-architectures", lambda: hydro.fuse([MLP((8, 4, 2)), MLP((8, 5, 2))]), hydro.FuseError,
         "member 1 differs from member 0 at module 'net.0'"),
    case("fuse-leaf-instance", lambda: hydro.fuse([MLP(), MLP()], leaf_modules=[nn.Linear(2, 2)]),  # fixed
         hydro.FuseError, "leaf_modules must be nn.Module classes, got Linear(in_features=2"),
    case("unfuse-plain-model", lambda: hydro.unfuse(MLP()), TypeError,  # fixed
         "hydro.unfuse needs the FusedModel that hydro.fuse returned, got MLP"),
    case("unfuse-list", lambda: hydro.unfuse([MLP()]), TypeError, "got list"),  # fixed
    case("keep-plain-model", lambda: hydro.keep_members(MLP(), [0]), TypeError,  # fixed
         "hydro.keep_members needs the FusedModel"),
    case("keep-no-members", lambda: hydro.keep_members(fused(), []), ValueError,
         "members must be distinct positions (ints) in [0, 3), got []"),
    case("keep-duplicate", lambda: hydro.keep_members(fused(), [0, 0]), ValueError, "got [0, 0]"),
    case("keep-out-of-range", lambda: hydro.keep_members(fused(), [3]), ValueError, "in [0, 3), got [3]"),
    case("keep-negative", lambda: hydro.keep_members(fused(), [-1]), ValueError, "got [-1]"),
    case("keep-float", lambda: hydro.keep_members(fused(), [0.5]), ValueError, "got [0.5]"),  # fixed
    case("keep-bool", lambda: hydro.keep_members(fused(), [True]), ValueError, "got [True]"),  # fixed
    case("keep-nested", lambda: hydro.keep_members(fused(), [[0]]), ValueError, "got [[0]]"),
    case("keep-torch-optimizer", lambda: keep_with(lambda m: torch.optim.SGD(m.parameters(), lr=0.1)),  # fixed
         TypeError, "optimizer must be a hydro.optim optimizer (its state is sliced per member), got torch.optim"),
    case("keep-other-models-optimizer", lambda: keep_with(lambda m: sgd()), ValueError,  # fixed
         "the optimizer holds parameters that are not this fused model's"),
    case("keep-torch-scheduler", lambda: keep_with(  # fixed
        lambda m: SGD(m.parameters(), lr=0.1),
        [lambda m, o: torch.optim.lr_scheduler.StepLR(torch.optim.SGD(m.parameters(), lr=0.1), 2)]),
         TypeError, "schedulers must be hydro.optim.lr_scheduler schedulers, got torch.optim.lr_scheduler.StepLR"),
    case("keep-scheduler-without-its-optimizer", lambda: keep_with(  # fixed
        None, [lambda m, o: sched.StepLR(SGD(m.parameters(), lr=0.1), 2)]), ValueError,
         "StepLR schedules another optimizer than the one given"),
    # --- hydro.optim: SGD, Adam, AdamW, clip_grad_norm_ -----------------------------------------------------------
    case("sgd-lr-wrong-length", lambda: sgd(lr=[0.1, 0.2]), ValueError,
         "SGD: hyperparameter 'lr' needs a scalar or 3 values (one per member), got 2"),
    case("sgd-lr-negative", lambda: sgd(lr=-0.1), ValueError, "SGD: lr must be >= 0 for every member, got [-0.1"),
    case("sgd-lr-string", lambda: sgd(lr="0.1"), TypeError,  # fixed
         "SGD: hyperparameter 'lr' must be a number or one number per member, got '0.1'"),
    case("sgd-lr-none", lambda: sgd(lr=None), TypeError, "hyperparameter 'lr' must be a number"),  # fixed
    case("sgd-momentum-negative", lambda: sgd(momentum=[-0.1, 0.9, 0.9]), ValueError,
         "SGD: momentum must be >= 0 for every member, got [-0.1, 0.9, 0.9]"),
    case("sgd-momentum-wrong-length", lambda: sgd(momentum=[0.9, 0.9]), ValueError,
         "hyperparameter 'momentum' needs a scalar or 3 values"),
    case("sgd-weight-decay-negative", lambda: sgd(weight_decay=-1e-4), ValueError, "SGD: weight_decay must be >= 0"),
    case("sgd-nesterov-without-momentum", lambda: sgd(nesterov=True), ValueError,
         "Nesterov momentum requires momentum > 0"),
    case("sgd-no-parameters", lambda: SGD([], lr=0.1), ValueError, "SGD: got no parameters"),  # fixed
    case("sgd-plain-params-per-member-lr", lambda: SGD([nn.Parameter(torch.zeros(3, 2)), nn.Parameter(
        torch.zeros(4, 2))], lr=[0.1, 0.2, 0.3]), ValueError, "the parameters are not fused"),
    case("adam-beta1-one", lambda: Adam(fused().parameters(), betas=(1.0, 0.999)), ValueError,
         "Adam: beta1 must be in [0, 1) for every member, got [1.0"),
    case("adam-beta2-negative", lambda: Adam(fused().parameters(), betas=(0.9, -0.1)), ValueError,
         "beta2 must be in [0, 1)"),
    case("adam-beta-nan", lambda: Adam(fused().parameters(), betas=(math.nan, 0.999)), ValueError,  # fixed
         "beta1 must be in [0, 1) for every member, got [nan"),
    case("adam-betas-triple", lambda: Adam(fused().parameters(), betas=(0.9, 0.99, 0.9)), ValueError,
         "betas must be a pair (beta1, beta2)"),
    case("adam-betas-scalar", lambda: Adam(fused().parameters(), betas=0.9), ValueError,  # fixed
         "Adam: betas must be a pair (beta1, beta2), each a scalar or one value per member, got 0.9"),
    case("adam-lr-nan", lambda: Adam(fused().parameters(), lr=math.nan), ValueError,  # fixed
         "Adam: lr must be >= 0 for every member, got [nan"),
    case("adam-lr-wrong-length", lambda: Adam(fused().parameters(), lr=[1e-3] * 4), ValueError,
         "Adam: hyperparameter 'lr' needs a scalar or 3 values"),
    case("adam-eps-negative", lambda: Adam(fused().parameters(), eps=-1e-8), ValueError, "Adam: eps must be >= 0"),
    case("adam-eps-string", lambda: Adam(fused().parameters(), eps="tiny"), TypeError,  # fixed
         "Adam: hyperparameter 'eps' must be a number or one number per member, got 'tiny'"),
    case("adamw-weight-decay-negative", lambda: AdamW(fused().parameters(), weight_decay=-0.01), ValueError,
         "AdamW: weight_decay must be >= 0"),
    case("clip-negative-max-norm", lambda: clip_grad_norm_(with_grads(fused()), -1.0), ValueError,  # fixed
         "clip_grad_norm_: max_norm must be >= 0 for every member, got [-1.0"),
    case("clip-max-norm-wrong-length", lambda: clip_grad_norm_(with_grads(fused()), [1.0, 2.0]), ValueError,
         "hyperparameter 'max_norm' needs a scalar or 3 values"),
    # --- hydro.optim.lr_scheduler ---------------------------------------------------------------------------------
    case("scheduler-of-torch-optimizer", lambda: sched.StepLR(torch.optim.SGD(MLP().parameters(), lr=0.1), 3),
         TypeError, "StepLR needs a hydro.optim optimizer, got SGD"),
    case("cosine-T_max-wrong-length", lambda: sched.CosineAnnealingLR(sgd(), T_max=[10, 20]), ValueError,
         "CosineAnnealingLR: hyperparameter 'T_max' needs a scalar or 3 values"),
    case("cosine-T_max-zero", lambda: sched.CosineAnnealingLR(sgd(), T_max=0), ValueError,  # fixed
         "CosineAnnealingLR: T_max must be > 0 (steps to the minimum) for every member, got [0.0"),
    case("cosine-T_max-negative", lambda: sched.CosineAnnealingLR(sgd(), T_max=[10, -1, 10]), ValueError,  # fixed
         "T_max must be > 0"),
    case("step-size-zero", lambda: sched.StepLR(sgd(), 0), ValueError,  # fixed
         "StepLR: step_size must be an int >= 1 (steps), got 0"),
    case("exponential-gamma-wrong-length", lambda: sched.ExponentialLR(sgd(), gamma=[0.9, 0.8]), ValueError,
         "ExponentialLR: hyperparameter 'gamma' needs a scalar or 3 values"),
    case("exponential-gamma-negative", lambda: sched.ExponentialLR(sgd(), gamma=-0.5), ValueError,  # fixed
         "ExponentialLR: gamma must be >= 0 for every member, got [-0.5"),
    case("linear-total-iters-zero", lambda: sched.LinearLR(sgd(), total_iters=0), ValueError,  # fixed
         "LinearLR: total_iters must be >= 1"),
    case("linear-start-factor-zero", lambda: sched.LinearLR(sgd(), start_factor=0), ValueError,  # fixed
         "LinearLR: start_factor must be in (0, 1]"),
    case("sequential-milestones", lambda: (lambda o: sched.SequentialLR(
        o, [sched.LinearLR(o), sched.CosineAnnealingLR(o, 10)], [3, 5]))(sgd()), ValueError,
         "SequentialLR needs len(schedulers) - 1 = 1 milestones, got 2"),
    # --- hydro.trial_losses -------------------------------------------------------------------------------------
    case("losses-unfused-output", lambda: hydro.trial_losses(  # fixed
        nn.CrossEntropyLoss(), torch.randn(4, 10), torch.randint(0, 10, (4,))), ValueError,
         "output (4, 10) and target (4,) do not pair up; expected the fused model's output [F, N, ...]"),
    case("losses-batch-mismatch", lambda: hydro.trial_losses(  # fixed
        nn.CrossEntropyLoss(), torch.randn(3, 4, 10), torch.randint(0, 10, (5,))), ValueError,
         "output (3, 4, 10) and target (5,) do not pair up"),
    case("losses-fused-target-member-count", lambda: hydro.trial_losses(  # fixed
        nn.MSELoss(), torch.randn(3, 4), torch.randn(2, 4), target_fused=True), ValueError,
         "target [F, N, ...] with the output's F"),
    case("losses-unreduced", lambda: hydro.trial_losses(nn.MSELoss(reduction="none"), torch.randn(3, 4),
                                                        torch.randn(4)), ValueError,
         "loss_fn must reduce each member's loss to a scalar"),
    case("losses-not-callable", lambda: hydro.trial_losses("mse", torch.randn(3, 4), torch.randn(4)),  # fixed
         TypeError, "loss_fn must be a loss function or module, got str"),
    case("losses-class-not-instance", lambda: hydro.trial_losses(nn.MSELoss, torch.randn(3, 4), torch.randn(4)),
         TypeError, "loss_fn is the class MSELoss; pass an instance, e.g. MSELoss()"),  # fixed
    # --- hydro.plan_fusion ----------------------------------------------------------------------------------------
    case("plan-max-members-zero", lambda: plan(max_members=0), ValueError,
         "plan_fusion: max_members must be an int >= 1, got 0"),
    case("plan-max-members-float", lambda: plan(max_members=2.5), ValueError, "max_members must be an int"),  # fixed
    case("plan-budget-negative", lambda: plan(memory_budget_bytes=-1), ValueError,  # fixed
         "plan_fusion: memory_budget_bytes must be None (the device's) or > 0, got -1"),
    case("plan-budget-zero", lambda: plan(memory_budget_bytes=0), ValueError, "memory_budget_bytes must be"),  # fixed
    case("plan-candidates-empty", lambda: plan(candidates=[]), ValueError,
         "candidates must be None or a non-empty list of ints in 1..max_members (2), got []"),
    case("plan-candidates-too-big", lambda: plan(candidates=[4]), ValueError, "got [4]"),
    case("plan-steps-zero", lambda: plan(steps=0), ValueError, "plan_fusion: steps must be an int >= 1"),  # fixed
    case("plan-tolerance-negative", lambda: plan(tolerance=-1), ValueError,  # fixed
         "plan_fusion: tolerance must be >= 0 (1: the largest count that fits), got -1"),
    case("plan-threads-zero", lambda: plan(threads=0), ValueError, "plan_fusion: threads must be None"),  # fixed
    case("plan-model-not-a-factory", lambda: hydro.plan_fusion(  # fixed
        MLP((8, 4, 2)), split(4), nn.CrossEntropyLoss()), TypeError,
         "model_factory must be a function returning a new model"),
    case("plan-batch-not-a-pair", lambda: hydro.plan_fusion(  # fixed
        lambda: MLP((8, 4, 2)), split(4)[0], nn.CrossEntropyLoss()), TypeError,
         "plan_fusion: batch must be (inputs, targets) tensors, got Tensor"),
    # --- hydro.shrink ---------------------------------------------------------------------------------------------
    case("shrink-scale-zero", lambda: hydro.shrink(MLP(), 0), hydro.ShrinkError,
         "scale must be an integer >= 1, got 0"),
    case("shrink-scale-float", lambda: hydro.shrink(MLP(), 2.0), hydro.ShrinkError, "got 2.0"),
    case("shrink-min-width-zero", lambda: hydro.shrink(MLP(), 2, min_width=0), hydro.ShrinkError,
         "min_width must be an integer >= 1, got 0"),
    case("shrink-fixed-string", lambda: hydro.shrink(MLP(), 2, fixed="net.0"), hydro.ShrinkError,
         "fixed must be a collection of module paths, got the string 'net.0'. Fix: fixed=['net.0']"),
    case("shrink-fixed-missing", lambda: hydro.shrink(MLP(), 2, fixed=["nope"]), hydro.ShrinkError,
         "fixed=['nope'] names no submodule of MLP"),
    case("shrink-not-a-module", lambda: hydro.shrink("MLP", 2), hydro.ShrinkError,  # fixed
         "model must be an nn.Module, got str"),
    case("shrink-fused-model", lambda: hydro.shrink(fused(), 2), hydro.ShrinkError,  # fixed
         "this model is fused (hydro.fuse); shrink the members, then fuse them"),
    case("shrink-twice", lambda: hydro.shrink(hydro.shrink(MLP(), 2), 2), hydro.ShrinkError,
         "already a shrunk (µP) model"),
    # --- TuneSpec -------------------------------------------------------------------------------------------------
    case("spec-epochs-zero", lambda: spec(epochs=0), ValueError, "TuneSpec.epochs must be an int >= 1, got 0"),
    case("spec-epochs-float", lambda: spec(epochs=2.5), ValueError, "TuneSpec.epochs must be an int"),  # fixed
    case("spec-epochs-string", lambda: spec(epochs="5"), ValueError, "got '5'"),  # fixed
    case("spec-batch-size-zero", lambda: spec(batch_size=0), ValueError,  # fixed
         "TuneSpec.batch_size must be an int >= 1, got 0"),
    case("spec-metric-not-reported", lambda: spec(metric="accuracy"), ValueError,
         "TuneSpec.metric 'accuracy' is not reported"),
    case("spec-mode", lambda: spec(mode="minimize"), ValueError, "TuneSpec.mode must be 'min' or 'max'"),
    case("spec-precision", lambda: spec(precision="fp8"), ValueError, "TuneSpec.precision must be one of"),
    case("spec-device", lambda: spec(device="gpu"), ValueError, "TuneSpec.device must be 'auto' or a torch device"),
    case("spec-checkpoint-every-zero", lambda: spec(checkpoint_every=0), ValueError,
         "TuneSpec.checkpoint_every must be an int >= 1 (epochs), got 0"),
    case("spec-data-workers-negative", lambda: spec(data_workers=-1), ValueError, "TuneSpec.data_workers must be"),
    case("spec-seed-string", lambda: spec(seed="0"), ValueError, "TuneSpec.seed must be an int, got '0'"),  # fixed
    case("spec-group-by-string", lambda: spec(group_by="kind"), ValueError,  # fixed
         "TuneSpec.group_by must be a list of names, got the string 'kind'. Fix: group_by=['kind']"),
    case("spec-shrink-fixed-string", lambda: spec(shrink_fixed="gru"), ValueError,  # fixed
         "TuneSpec.shrink_fixed must be a list of names, got the string 'gru'"),
    case("spec-metrics-list", lambda: spec(metrics=[accuracy]), TypeError,  # fixed
         "TuneSpec.metrics must map names to functions, got list"),
    case("spec-metric-not-callable", lambda: spec(metrics={"acc": 1.0}, metric="acc"), TypeError,  # fixed
         "TuneSpec.metrics['acc'] must be a function"),
    case("spec-metric-shadows-val-loss", lambda: spec(metrics={"val_loss": accuracy}), ValueError,  # fixed
         "TuneSpec.metrics: 'val_loss' is reported by Hydro itself"),
    case("spec-model-instance", lambda: spec(model=MLP()), TypeError,  # fixed
         "TuneSpec.model must be a function config -> nn.Module"),
    case("spec-optimizer-class", lambda: spec(optimizer=torch.optim.SGD), TypeError,  # fixed
         "TuneSpec.optimizer is called as optimizer(params, config), got SGD"),
    case("spec-loss-class", lambda: spec(loss=nn.CrossEntropyLoss), TypeError,  # fixed
         "TuneSpec.loss is the class CrossEntropyLoss; pass an instance"),
    case("spec-data-not-callable", lambda: spec(data=(split(), split())), TypeError,  # fixed
         "TuneSpec.data must be a function returning (train, val), got tuple"),
    case("spec-leaf-module-instance", lambda: spec(leaf_modules=[nn.Linear(2, 2)]), hydro.FuseError,  # fixed
         "TuneSpec.leaf_modules: leaf_modules must be nn.Module classes"),
    case("data-one-split", lambda: spec(data=split).load_data(), ValueError,
         "the train split of TuneSpec.data() must be (inputs, targets) tensors"),
    case("data-dict", lambda: spec(data=lambda: {"train": split(), "val": split()}).load_data(), ValueError,
         "TuneSpec.data() must return (train, val)"),
    case("data-three-splits", lambda: spec(data=lambda: (split(), split(), split())).load_data(), ValueError,  # fixed
         "TuneSpec.data() must return (train, val), each (inputs, targets) tensors, an object with .x/.y, a torch "
         "Dataset or a LoaderFactory; got 3 values"),
    case("data-length-mismatch", lambda: spec(data=lambda: ((split()[0], split(5)[1]), split())).load_data(),
         ValueError, "inputs hold 16 samples but targets 5"),
    case("data-numpy", lambda: spec(data=lambda: (tuple(t.numpy() for t in split()), split())).load_data(),
         ValueError, "got tuple"),
    case("data-empty-split", lambda: spec(data=lambda: (split(0), split())).load_data(), ValueError,  # fixed
         "the train split of TuneSpec.data() holds no samples"),
    # --- prepare / check_arguments / HydroSearcher (no Ray cluster) -----------------------------------------------
    case("prepare-scale-zero", lambda: prepare(spec(), SPACE, scale=0), WorkloadError,
         "scale must be an integer >= 1 (1 = full size) or 'auto', got 0"),
    case("prepare-scale-bool", lambda: prepare(spec(), SPACE, scale=True), WorkloadError, "got True"),  # fixed
    case("prepare-empty-space", lambda: prepare(spec(), {}), WorkloadError,  # fixed
         "param_space must be a dict of the hyperparameters to tune"),
    case("prepare-space-list", lambda: prepare(spec(), [("lr", 0.1)]), WorkloadError,  # fixed
         "param_space must be a dict"),
    case("prepare-config-lacks-a-key", lambda: prepare(spec(), {"learning_rate": 0.1}), WorkloadError,
         "the workload fails before tuning starts, training two fused members at scale 1 one batch with the "
         "configuration {'learning_rate': 0.1}: KeyError: 'lr'"),
    case("prepare-memory-budget-negative", lambda: prepare(spec(memory_budget_bytes=-5), SPACE), WorkloadError,
         "ValueError: hydro.trial.memory: a memory budget must be > 0 bytes, got -5"),
    case("prepare-shrink-min-width-zero", lambda: prepare(spec(shrink_min_width=0), SPACE, scale=2), WorkloadError,
         "hydro.shrink: min_width must be an integer >= 1, got 0"),
    case("prepare-shrink-fixed-missing", lambda: prepare(spec(shrink_fixed=["nope"]), SPACE, scale=2), WorkloadError,
         "hydro.shrink: fixed=['nope'] names no submodule of MLP"),
    case("fit-num-samples-zero", lambda: fit(spec(), SPACE, num_samples=0), ValueError,  # fixed
         "num_samples (member configurations) must be an int >= 1, got 0"),
    case("fit-unknown-transfer-option", lambda: fit(spec(), SPACE, num_samples=4, etta=3), TypeError,  # fixed
         "HydroSearcher: unknown transfer option(s) ['etta']"),
    case("check-cpus-zero", lambda: check_arguments(spec(), SPACE, cpus_per_trial=0), ValueError,
         "cpus_per_trial must be > 0, got 0"),
    case("check-gpus-fraction-above-one", lambda: check_arguments(spec(), SPACE, gpus_per_trial=1.5), ValueError,
         "gpus_per_trial must be a fraction in [0, 1] or a whole number of GPUs"),
    case("check-cuda-device-without-gpus", lambda: check_arguments(spec(device="cuda"), SPACE), ValueError,
         "TuneSpec.device='cuda' but gpus_per_trial=0"),
    case("check-energy-batch-size-in-space", lambda: check_arguments(spec(), {**SPACE, "batch_size": 32},
                                                                     energy=energy(batch_sizes=(32,))), ValueError,
         "remove 'batch_size' from the param space"),
    case("check-energy-batch-sizes-miss-the-workloads", lambda: check_arguments(  # fixed
        spec(), SPACE, energy=energy(batch_sizes=(16, 64))), ValueError,
         "the workload's batch size 32 is not among the bandit's batch sizes [16, 64]"),
    case("check-bubbles-with-gpus", lambda: check_arguments(spec(), SPACE, bubbles=True, gpus_per_trial=1),
         ValueError, "gpus_per_trial does not apply with bubbles=True"),
    case("searcher-scale-zero", lambda: searcher(scale=0), ValueError,
         "HydroSearcher: scale must be an int >= 1 (the surrogates' width divisor; 1: full size) or 'auto' (measured), "
         "got 0"),
    case("searcher-fusion-zero", lambda: searcher(fusion=0), ValueError, "fusion must be 'auto' or an int >= 1, got 0"),
    case("searcher-fusion-string", lambda: searcher(fusion="max"), ValueError, "got 'max'"),
    case("searcher-num-samples-zero", lambda: searcher(num_samples=0), ValueError,
         "num_samples (member configurations) must be an int >= 1, got 0"),
    case("searcher-num-samples-float", lambda: searcher(num_samples=2.5), ValueError, "got 2.5"),  # fixed
    case("searcher-max-fusion-zero", lambda: searcher(max_fusion=0), ValueError, "max_fusion (members per fused"),
    case("searcher-trial-cpus-zero", lambda: searcher(trial_cpus=0), ValueError, "trial_cpus must be >= 1, got 0"),
    case("searcher-scale-word", lambda: searcher(scale="big"), ValueError,
         "HydroSearcher: scale must be an int >= 1 (the surrogates' width divisor; 1: full size) or 'auto' (measured), "
         "got 'big'"),
    case("searcher-trial-resources-negative", lambda: searcher(trial_resources={"CPU": -1}), ValueError,
         "trial_resources holds Ray resource amounts >= 0 per trial, e.g. {'CPU': 1, 'GPU': 0.5}; got {'CPU': -1}"),
    case("searcher-trial-resources-not-a-mapping", lambda: searcher(trial_resources=2), ValueError,
         "trial_resources holds Ray resource amounts >= 0 per trial, e.g. {'CPU': 1, 'GPU': 0.5}; got 2"),
    case("searcher-not-a-searcher", lambda: searcher({"lr": 0.1}), TypeError,  # fixed
         "HydroSearcher: searcher must be a Ray Tune Searcher (e.g. OptunaSearch()) or None"),
    case("transfer-eta-one", lambda: searcher(eta=1), ValueError, "eta must be an int >= 2, got 1"),
    case("transfer-top-k-zero", lambda: searcher(top_k=0), ValueError, "top_k must be an int >= 1, got 0"),
    case("transfer-seeds-zero", lambda: searcher(seeds=0), ValueError, "seeds must be an int >= 1, got 0"),
    case("transfer-max-target-drop-negative", lambda: searcher(max_target_drop=-0.1), ValueError,
         "max_target_drop must be >= 0, got -0.1"),
    case("transfer-fallback-targets-negative", lambda: searcher(fallback_targets=-1), ValueError,
         "fallback_targets must be an int >= 0, got -1"),
    case("transfer-fraction-zero", lambda: searcher(transfer_fraction=0), ValueError,
         "transfer_fraction must be in (0, 1] or None, got 0"),
    case("transfer-fraction-above-one", lambda: searcher(transfer_fraction=1.5), ValueError, "got 1.5"),
    case("transfer-ladder-string", lambda: searcher(ladder="no"), ValueError,  # fixed
         "ladder must be True or False, got 'no'"),
    case("transfer-escalate-int", lambda: searcher(escalate=1), ValueError,
         "escalate must be True or False, got 1"),
    case("transfer-disagreement-string", lambda: searcher(disagreement="likely"), ValueError,
         "disagreement must be a schedulers.transfer.Disagreement (Disagreement.PROBE, Disagreement.LIKELY, "
         "Disagreement.CONFIDENT), got 'likely'"),
    case("transfer-probes-negative", lambda: searcher(probes=-1), ValueError, "probes must be an int >= 0, got -1"),
    case("transfer-probe-margin-negative", lambda: searcher(probe_margin=-0.01), ValueError,
         "probe_margin must be >= 0, got -0.01"),
    case("transfer-probe-margin-string", lambda: searcher(probe_margin="1%"), ValueError,
         "probe_margin must be >= 0, got '1%'"),
    case("transfer-min-agreement-above-one", lambda: searcher(min_agreement=2.0), ValueError,  # fixed
         "min_agreement is a Spearman rho, in [-1, 1]; got 2.0"),
    case("transfer-unknown-option", lambda: searcher(etta=3), TypeError,  # fixed
         "HydroSearcher: unknown transfer option(s) ['etta']; the transfer options are"),
    case("transfer-top-k-unshrunk", lambda: searcher(top_k=2), ValueError,  # fixed
         "TransferPolicy: top_k=2 cannot act, scale is 1"),
    case("transfer-option-without-stages", lambda: searcher(scale=8, transfer_fraction=None, probes=5),  # fixed
         ValueError, "TransferPolicy: probes=5 cannot act, transfer_fraction is None"),
    case("searcher-scheduler-other-metric", lambda: searcher(scheduler=ASHAScheduler(metric="acc", mode="max")),
         ValueError, "the scheduler's metric 'acc' differs from the tuned metric 'val_acc'"),
    case("searcher-scheduler-pbt", lambda: searcher(scheduler=PopulationBasedTraining(
        hyperparam_mutations={"lr": [0.1]})), TypeError, "per-member stopping supports ASHAScheduler"),
    case("asha-reduction-factor-one", lambda: ASHA(max_t=10, reduction_factor=1), ValueError,
         "ASHA reduction_factor must be > 1, got 1"),
    case("asha-grace-above-max-t", lambda: ASHA(max_t=3, grace_period=5), ValueError,
         "ASHA needs 1 <= grace_period <= max_t, got grace_period=5, max_t=3"),
    case("convergence-grace-two", lambda: ConvergenceStopping(max_t=10, grace_period=2), ValueError,
         "ConvergenceStopping needs 3 <= grace_period <= max_t"),
    # --- energy -------------------------------------------------------------------------------------------------
    case("energy-beta-one", lambda: energy(beta=1.0), ValueError, "beta=1.0 must be > 1"),
    case("energy-beta-nan", lambda: energy(beta=math.nan), ValueError, "beta=nan must be > 1"),  # fixed
    case("energy-eta-above-one", lambda: energy(eta=2), ValueError, "eta=2 is outside [0, 1]"),
    case("energy-batch-size-zero", lambda: energy(batch_sizes=(0, 8)), ValueError,
         "batch sizes must be ints >= 1, got [0, 8]"),
    case("energy-devices", lambda: energy(devices="gpu"), ValueError,  # fixed
         "hydro.energy: devices must be one of ['detect', 'simulated'], got 'gpu'"),
    case("energy-window-steps-zero", lambda: energy(window_steps=0), ValueError,  # fixed
         "hydro.energy: window_steps must be an int >= 1"),
    case("energy-warmup-steps-negative", lambda: energy(warmup_steps=-1), ValueError,  # fixed
         "hydro.energy: warmup_steps must be an int >= 0, got -1"),
    case("energy-max-power-negative", lambda: energy(max_power_w=-5), ValueError,  # fixed
         "hydro.energy: max_power_w must be None or > 0 (W), got -5"),
    case("energy-scheduler-empty-batch-sizes", lambda: EnergyScheduler(  # fixed
        job="j", store_path="unused.db", energy_tuned=True, batch_sizes=[], default_batch_size=32), ValueError,
         "energy_tuned=True needs batch_sizes and default_batch_size for the bandit, got batch_sizes=[]"),
    case("energy-scheduler-beta-one", lambda: EnergyScheduler(job="j", store_path="unused.db", beta=1.0),  # fixed
         ValueError, "EnergyScheduler: beta=1.0 must be > 1"),
    case("energy-for-hydro-batch-sizes", lambda: for_hydro(energy(batch_sizes=(16, 64)), spec()), ValueError,
         "the workload's batch size 32 is not among the bandit's batch sizes [16, 64]"),
    # --- pipeline / bubbles -------------------------------------------------------------------------------------
    case("pipeline-width-zero", lambda: PipelineSpec(width=0), ValueError,  # fixed
         "bubbles: PipelineSpec.width must be an int >= 1, got 0"),
    case("pipeline-microbatches-zero", lambda: PipelineSpec(microbatches=0), ValueError,  # fixed
         "PipelineSpec.microbatches must be an int >= 1, got 0"),
    case("pipeline-microbatch-size-zero", lambda: PipelineSpec(microbatch_size=0), ValueError,  # fixed
         "PipelineSpec.microbatch_size must be an int >= 1, got 0"),
    case("pipeline-depth-negative", lambda: PipelineSpec(depth=-1), ValueError, "PipelineSpec.depth must be"),  # fixed
    case("pipeline-lr-negative", lambda: PipelineSpec(lr=-0.1), ValueError,  # fixed
         "PipelineSpec.lr must be >= 0, got -0.1"),
    case("pipeline-more-stages-than-layers", lambda: PipelineSpec(depth=2).stage_model(0, 4), ValueError,
         "bubbles: stage 0 of 4 stages; the model has 3 linear layers (depth + 1), so use 1..3 stages"),
    case("pipeline-stages-share-a-gpu", lambda: PipelineJob(PipelineSpec(), 2, num_gpus_per_stage=0.5),  # fixed
         ValueError, "num_gpus_per_stage=0.5 lets Ray put two stages on one GPU, and NCCL cannot connect two ranks"),
    case("schedule-no-stages", lambda: one_f_one_b(0, 4), ValueError,  # fixed
         "a 1F1B schedule needs at least one stage and one microbatch, got num_stages=0, num_microbatches=4"),
    # --- GPU options and resources (TuneSpec backend fields, trial resources) ----------------------------------
    case("spec-memory-format-unknown", lambda: spec(memory_format="nhwc"), ValueError,
         "TuneSpec.memory_format must be one of ['contiguous', 'channels_last'], got 'nhwc'"),
    case("spec-tf32-not-a-bool", lambda: spec(tf32="yes"), ValueError, "TuneSpec.tf32 must be None or a bool, got 'yes'"),
    case("spec-cuda-graphs-on-cpu", lambda: spec(cuda_graphs=True, device="cpu"), ValueError,
         "TuneSpec.cuda_graphs=True needs a CUDA device, but this trial trains on cpu"),
    case("fit-several-gpus-per-trial", lambda: check_arguments(spec(), SPACE, gpus_per_trial=2), ValueError,
         "gpus_per_trial=2, but a fused trial trains on one GPU and would leave the others idle"),
    # --- recurrent layers and shrink errors (cause and fix first) -------------------------------------------------
    case("shrink-no-width", lambda: hydro.shrink(nn.Sequential(nn.Linear(8, 2)), 4), hydro.ShrinkError,  # fixed
         "hydro.shrink: Sequential has no width to shrink. Fix: tune it at full size (scale=1; hydro tune --scale 1)"),
    case("shrink-scale-divides-no-width", lambda: hydro.shrink(MLP((8, 48, 2)), 5), hydro.ShrinkError,  # fixed
         "hydro.shrink: at scale 5, MLP has no width left to shrink (48 is not divisible by scale 5). Fix: a scale "
         "that divides its widths (2, 3, 4, 6), or full size (scale=1; hydro tune --scale 1)"),
    case("fused-gru-packed-sequence", lambda: hydro.nn.GRU(4, 8, num_members=2)(
        nn.utils.rnn.pack_sequence([torch.zeros(3, 4)])), TypeError,
         "hydro.nn.GRU: PackedSequence inputs cannot be fused. Fix: pass the padded batch"),
    # --- LR schedules and parameter groups (TuneSpec.lr_scheduler, the optimizer factory) -------------------------
    case("schedule-made-in-optimizer-factory", lambda: prepare(spec(optimizer=lambda p, c: (  # fixed (was silent)
        o := torch.optim.SGD(p, lr=c["lr"]), torch.optim.lr_scheduler.LambdaLR(o, lambda s: 0.01))[0]), SPACE),
         WorkloadError, "created an LR scheduler (torch.optim.lr_scheduler.LambdaLR); Hydro would train with the "
                        "learning rate it set first and never step it. Fix: return only the optimizer"),
    case("lr-scheduler-unsupported-class", lambda: prepare(spec(  # new option
        lr_scheduler=lambda o, c: torch.optim.lr_scheduler.CyclicLR(o, 0.01, 0.1)), SPACE), WorkloadError,
         "TuneSpec.lr_scheduler returned torch.optim.lr_scheduler.CyclicLR; fused training supports"),
    case("lr-scheduler-a-class", lambda: spec(lr_scheduler=torch.optim.lr_scheduler.StepLR), TypeError,
         "TuneSpec.lr_scheduler is called as lr_scheduler(optimizer, config), got StepLR"),
    case("lr-scheduler-interval-unknown", lambda: spec(lr_scheduler_interval="step"), ValueError,
         "TuneSpec.lr_scheduler_interval must be one of ['batch', 'epoch'], got 'step'"),
    case("lr-scheduler-plateau-per-batch", lambda: prepare(spec(
        lr_scheduler=lambda o, c: torch.optim.lr_scheduler.ReduceLROnPlateau(o), lr_scheduler_interval="batch"),
        SPACE), WorkloadError, "ReduceLROnPlateau follows an epoch's validation metric; set "
                               "TuneSpec.lr_scheduler_interval='epoch'"),
    case("plateau-factor-not-below-one", lambda: sched.ReduceLROnPlateau(sgd(), factor=[0.5, 1.5, 0.5]), ValueError,
         "ReduceLROnPlateau: factor must be < 1 for every member, got [0.5, 1.5, 0.5]"),
    case("lambda-lr-wrong-count", lambda: sched.LambdaLR(sgd(), [lambda s: 1.0] * 2), ValueError,
         "LambdaLR: lr_lambdas must be a function, 3 functions (one per member)"),
    # faults during a run
    case("choice-empty", lambda: prepare(spec(), {**SPACE, "momentum": ray.tune.choice([])}), ValueError,  # fixed
         "param_space['momentum'] is tune.choice([]): it has no value to draw"),
    case("grid-search-empty", lambda: prepare(spec(), {**SPACE, "momentum": ray.tune.grid_search([])}),  # fixed
         ValueError, "param_space['momentum'] is tune.grid_search([]): it has no value to train"),
    case("nan-in-training-data", lambda: prepare(*FAULTS.nan_data()), WorkloadError,  # fixed
         "the training data's inputs hold 1 NaN or inf value(s)"),
    case("loss-broadcasts-output-n1-target-n", lambda: hydro.trial_losses(  # fixed
        nn.MSELoss(), torch.zeros(2, 8, 1), torch.zeros(8)), ValueError,
         "MSELoss pairs each member's output (8, 1) with the target (8,) element by element; torch would broadcast"),
    case("workload-loss-broadcasts", lambda: prepare(*FAULTS.mse_broadcast()), WorkloadError,  # fixed
         "torch would broadcast them to (32, 32)"),
    case("every-draw-diverges", lambda: prepare(*FAULTS.diverging_draws()), WorkloadError,
         "ValueError: Input contains NaN, infinity"),
    case("storage-not-writable", lambda: (Path("a-file").write_text(""),  # fixed
                                          fit(spec(), SPACE, num_samples=2, storage_path="a-file/runs")),
         ValueError, "a-file/runs is not a folder Hydro can write to (NotADirectoryError"),
    case("resume-no-run", lambda: hydro.tune.run.resume("nowhere", spec()), ValueError,
         "nowhere holds no run to resume (no tuner.pkl)"),
    case("searcher-lost-trial-retries-negative", lambda: searcher(lost_trial_retries=-1), ValueError,
         "lost_trial_retries must be an int >= 0, got -1"),
    # real workloads
    case("batch-size-uniform", lambda: prepare(*real_workloads.float_batch_size()), ValueError,  # fixed
         "param_space['batch_size'] is a float range [16, 128], which samples non-integer batch sizes"),
    case("batch-size-float", lambda: prepare(spec(), {**SPACE, "batch_size": 97.7}), ValueError,  # fixed
         "param_space['batch_size'] is 97.7, not an integer"),
    case("batch-size-choice-of-floats", lambda: prepare(spec(), {**SPACE, "batch_size": ray.tune.choice([32, 97.5])}),
         ValueError, "param_space['batch_size'] offers non-integer batch sizes [97.5]"),  # fixed
    case("batch-size-uniform-in-a-tuner", lambda: searcher().set_search_properties(  # fixed
        None, None, {**SPACE, "batch_size": ray.tune.uniform(16, 128)}), ValueError,
         "Sample integers instead, e.g. tune.choice([16, 32, 64, 128]), tune.qrandint(16, 128, 16)"),
    case("group-by-misses-a-width", lambda: prepare(*real_workloads.width_not_grouped(), scale=4),  # fixed
         WorkloadError, "TuneSpec.group_by misses 'width'"),
    case("group-by-misses-a-dropout-p", lambda: prepare(*real_workloads.dropout_not_grouped()),  # fixed
         WorkloadError, "TuneSpec.group_by misses 'p'"),
    case("load-model-run-directory-without-a-model", lambda: hydro.tune.load_model("no_such_run"),  # fixed
         ValueError, "hydro.tune.load_model: no_such_run holds no trained full-size model (hydro_model.pt)"),
    # placement on GPU types
    case("searcher-placement-unknown", lambda: searcher(placement="fastest"), ValueError,
         "placement must be None or one of ['elastic'], got 'fastest'"),
    case("placement-on-a-local-cluster-without-gpus", lambda: fit(spec(), SPACE, num_samples=2, placement="elastic"),
         ValueError, "the cluster Hydro starts on this machine has none (no GPU here)"),
    # --- energy and bubbles per stage (hydro.tune.pipeline.stage_energy, schedulers.pipeline_energy) -----------
    case("fill-rate-compute-share-above-one", lambda: FillRate(10.0, 1.5), ValueError,
         "FillRate(10.0, 1.5) needs member-steps per bubble second >= 0 and a compute share in [0, 1]"),
    case("fill-value-negative-worth", lambda: FillValue(10.0, 0.5, -1.0, 300.0), ValueError,
         "FillValue.joules_per_member_step=-1.0 must be a measured value >= 0"),
    # rung halving
    case("transfer-halving-string", lambda: searcher(halving="yes"), ValueError,
         "halving must be True, False or 'auto', got 'yes'"),
    case("transfer-epochs-set-by-the-searcher", lambda: searcher(epochs=4), TypeError,
         "unknown transfer option(s) ['epochs']"),
]


@pytest.mark.parametrize("trigger, error, match", CASES)
def test_api_refuses(trigger, error, match, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # "unused.db" stores land here if a check ever let one be created
    with pytest.raises(error) as raised:
        trigger()
    assert match in str(raised.value), str(raised.value)
    assert not isinstance(raised.value, INTERNAL)
    origin = traceback.extract_tb(raised.tb)[-1].filename
    assert origin.startswith(OWN_CODE), f"raised in {origin}, not by Hydro's own checks"
    assert not ray.is_initialized()


WORKLOAD = '''
from hydro.tune.examples import EXAMPLES


def empty_space():
    return EXAMPLES["digits-mlp"]()[0], {}


def not_a_pair():
    return {"lr": 0.1}


def raises():
    raise RuntimeError("no data here")
'''

ENERGY = ["--energy", "--energy-devices", "simulated"]
SIMULATE = ["energy", "simulate", "--out", "{dir}/out", "--traces", "{dir}/traces"]


def tune(*argv: str) -> list[str]:
    return ["tune", "--example", "digits-mlp", *argv]


CLI_CASES = [  # argparse's own errors first, then Hydro's (one line, exit code 2)
    case("no-workload", ["tune"], "argparse", "one of the arguments --example --workload is required"),
    case("example-and-workload", tune("--workload", "x"), "argparse", "argument --workload: not allowed with argument"),
    case("unknown-example", ["tune", "--example", "nope"], "argparse", "argument --example: invalid choice: 'nope'"),
    case("samples-not-an-integer", tune("--samples", "abc"), "argparse", "argument --samples: 'abc' is not an integer"),
    case("samples-zero", tune("--samples", "0"), "argparse", "argument --samples: must be >= 1, got 0"),
    case("scale-zero", tune("--scale", "0"), "argparse",
         "argument --scale: give 'auto' or a width divisor >= 1 (must be >= 1, got 0)"),
    case("scale-word", tune("--scale", "big"), "argparse",
         "argument --scale: give 'auto' or a width divisor >= 1 ('big' is not an integer)"),
    case("epochs-zero", tune("--epochs", "0"), "argparse", "argument --epochs: must be >= 1, got 0"),
    case("epochs-float", tune("--epochs", "2.5"), "argparse", "argument --epochs: '2.5' is not an integer"),
    case("fusion-word", tune("--fusion", "abc"), "argparse",
         "argument --fusion: give 'auto' or a number of members >= 1"),
    case("transfer-fraction-zero", tune("--transfer-fraction", "0"), "argparse",
         "argument --transfer-fraction: must be in (0, 1], got 0.0"),
    case("transfer-fraction-nan", tune("--transfer-fraction", "nan"), "argparse", "must be in (0, 1], got nan"),
    case("min-width-zero", tune("--min-width", "0"), "argparse", "argument --min-width: must be >= 1, got 0"),
    case("transfer-eta-one", tune("--eta", "1"), "argparse", "argument --eta: must be >= 2, got 1"),
    case("transfer-probe-margin-negative", tune("--probe-margin", "-0.01"), "argparse",
         "argument --probe-margin: must be >= 0, got -0.01"),
    case("transfer-disagreement-word", tune("--disagreement", "sometimes"), "argparse",
         "argument --disagreement: invalid choice: 'sometimes'"),
    case("unknown-scheduler", tune("--scheduler", "bogus"), "argparse",
         "argument --scheduler: invalid choice: 'bogus'"),
    case("seed-word", tune("--seed", "abc"), "argparse", "argument --seed: invalid int value: 'abc'"),
    case("simulate-seeds-zero", [*SIMULATE, "--seeds", "0"], "argparse",  # fixed
         "argument --seeds: must be >= 1, got 0"),
    case("simulate-recurrences-zero", [*SIMULATE, "--recurrences", "0"], "argparse",  # fixed
         "argument --recurrences: must be >= 1, got 0"),
    case("simulate-eta-above-one", [*SIMULATE, "--eta", "2"], "argparse",  # fixed
         "argument --eta: must be in [0, 1], got 2.0"),
    case("simulate-beta-one", [*SIMULATE, "--beta", "1"], "argparse", "argument --beta: must be > 1, got 1.0"),  # fixed
    case("simulate-no-traces", ["energy", "simulate", "--traces", "{dir}/nowhere"], "hydro",  # fixed
         "hydro energy simulate: Zeus traces not found in {dir}/nowhere"),
    case("simulate-gpu-without-trace", [*SIMULATE, "--gpus", "a100"], "hydro",  # fixed
         "hydro energy simulate: no power trace for --gpus a100 in {dir}/traces; available: v100"),
    case("energy-option-without-energy", tune("--energy-eta", "0.7"), "hydro",
         "hydro tune: --energy-eta only applies with --energy; add --energy or leave it out"),
    case("transfer-top-k-unshrunk", tune("--top-k", "2"), "hydro",  # fixed
         "hydro tune: TransferPolicy: top_k=2 cannot act, scale is 1: the search trains full-size models"),
    case("energy-beta-one", tune(*ENERGY, "--energy-beta", "1"), "hydro", "beta=1.0 must be > 1"),
    case("energy-beta-nan", tune(*ENERGY, "--energy-beta", "nan"), "hydro", "beta=nan must be > 1"),  # fixed
    case("energy-eta-above-one", tune(*ENERGY, "--energy-eta", "2"), "hydro", "eta=2.0 is outside [0, 1]"),
    case("energy-batch-size-zero", tune(*ENERGY, "--energy-batch-sizes", "0"), "hydro",
         "batch sizes must be ints >= 1, got [0]"),
    case("energy-batch-sizes-miss-the-workloads", tune(*ENERGY, "--energy-batch-sizes", "7", "9"), "hydro",  # fixed
         "hydro tune: hydro tune --energy: the workload's batch size 64 is not among the bandit's batch sizes [7, 9]"),
    case("gpus-per-trial-fraction-above-one", tune("--gpus-per-trial", "1.5"), "hydro",
         "hydro tune: hydro.tune: gpus_per_trial must be a fraction in [0, 1] or a whole number of GPUs"),
    case("bubbles-without-a-cluster", tune("--bubbles"), "hydro", "hydro tune --bubbles: give the cluster"),
    case("workload-file-missing", ["tune", "--workload", "{dir}/missing.py"], "hydro",
         "workload file '{dir}/missing.py' does not exist"),
    case("workload-function-missing", ["tune", "--workload", "{dir}/workload.py:nofunc"], "hydro",
         "'{dir}/workload.py' defines no function 'nofunc' returning (TuneSpec, param_space)"),
    case("workload-returns-no-pair", ["tune", "--workload", "{dir}/workload.py:not_a_pair"], "hydro",
         "{dir}/workload.py:not_a_pair must return (TuneSpec, param_space), got dict"),
    case("workload-raises", ["tune", "--workload", "{dir}/workload.py:raises"], "hydro",
         "calling raises() failed: {dir}/workload.py:14: RuntimeError: no data here"),
    case("workload-empty-param-space", ["tune", "--workload", "{dir}/workload.py:empty_space"], "hydro",  # fixed
         "hydro tune: hydro: param_space must be a dict of the hyperparameters to tune"),
    # --- recurrent layers and shrink errors (cause and fix first) -------------------------------------------------
    case("scale-divides-no-width", tune("--scale", "3"), "hydro",  # fixed
         "hydro tune: hydro.shrink: at scale 3, MLP has no width left to shrink (512 is not divisible by scale 3). "
         "Fix: a scale that divides its widths (2, 4, 8, 16), or full size (scale=1; hydro tune --scale 1)"),
    # faults during a run
    case("max-failures-negative", tune("--max-failures", "-1"), "argparse",
         "argument --max-failures: must be >= 0, got -1"),
    case("storage-not-writable", tune("--storage", "{dir}/workload.py/runs"), "hydro",  # fixed
         "hydro tune: hydro: the storage path {dir}/workload.py/runs is not a folder Hydro can write to"),
    case("resume-no-run", tune("--resume", "{dir}/traces"), "hydro",
         "hydro tune: hydro: {dir}/traces holds no run to resume (no tuner.pkl)"),
    case("workload-choice-empty", ["tune", "--workload", f"{FAULT_WORKLOADS}:empty_choice"], "hydro",  # fixed
         "hydro tune: hydro: param_space['momentum'] is tune.choice([]): it has no value to draw"),
    case("workload-nan-in-data", ["tune", "--workload", f"{FAULT_WORKLOADS}:nan_data"], "hydro",  # fixed
         "hydro tune: hydro: the training data's inputs hold 1 NaN or inf value(s)"),
    case("workload-loss-broadcasts", ["tune", "--workload", f"{FAULT_WORKLOADS}:mse_broadcast"], "hydro",  # fixed
         "MSELoss pairs each member's output (32, 1) with the target (32,) element by element"),
    # real workloads
    case("batch-size-uniform", ["tune", "--workload", "tests.tune.real_workloads:float_batch_size"], "hydro",  # fixed
         "hydro tune: hydro: param_space['batch_size'] is a float range [16, 128]"),
    case("group-by-misses-a-width", ["tune", "--workload", "tests.tune.real_workloads:width_not_grouped",  # fixed
                                     "--scale", "4"], "hydro", "hydro tune: hydro: TuneSpec.group_by misses 'width'"),
    case("group-by-misses-a-dropout-p", ["tune", "--workload", "tests.tune.real_workloads:dropout_not_grouped"],
         "hydro", "hydro tune: hydro: TuneSpec.group_by misses 'p'"),  # fixed
    # placement on GPU types
    case("placement-unknown", tune("--placement", "fastest"), "argparse",
         "argument --placement: invalid choice: 'fastest'"),
    case("placement-on-a-local-cluster-without-gpus", tune("--placement", "elastic"), "hydro",
         "hydro tune: hydro: placement='elastic' (--placement elastic) places trials on the GPU types of a cluster"),
]


@pytest.fixture(scope="module")
def cli_dir(tmp_path_factory) -> Path:
    """A workload file (``WORKLOAD``) and a trace directory with a V100 power trace only."""
    folder = tmp_path_factory.mktemp("cli")
    (folder / "workload.py").write_text(WORKLOAD)
    (folder / "traces").mkdir()
    (folder / "traces" / "summary_train.csv").write_text("")
    (folder / "traces" / "summary_power_v100.csv").write_text("")
    return folder


@pytest.mark.parametrize("argv, kind, match", CLI_CASES)
def test_cli_refuses(argv, kind, match, cli_dir, capsys, monkeypatch):
    """``kind``: ``"argparse"`` for argparse's own errors (its usage, then one error line), ``"hydro"`` for Hydro's
    (one line)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    argv = [arg.format(dir=cli_dir) for arg in argv]
    if kind == "argparse":
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        code = exit_.value.code
    else:
        code = main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert match.format(dir=cli_dir) in lines[-1], err
    assert lines[0].startswith("usage: hydro") if kind == "argparse" else len(lines) == 1, err
    assert not ray.is_initialized()
