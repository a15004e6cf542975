"""Transfer fidelity: is the configuration Hydro returns as good at full size as a full-size search's best?

Per workload, N configurations are drawn once (seeded random search) and tuned
  * stock: every configuration trained at full size as written (standard parametrization, unfused);
  * stock + ASHA, the speed baseline: the same trainings, one at a time in the drawn order, evaluated after every
    epoch and stopped early as Ray Tune's ``ASHAScheduler`` stops them (``schedulers.member_stopping.ASHA``, the
    same rule; grace period 1 epoch, reduction factor 2, as users run it; Tune's default factor is 4); its
    returned configuration is the one with the best last score;
  * Hydro S=4 / S=8: all N as µP surrogates of width ÷ S in one fused trial, then the best one's configuration
    trained at full size in µP (the target, as ``HydroSearcher``'s target trial trains it);
  * Hydro S=4 / S=8 with the remedies of ``schedulers.transfer.TransferPolicy`` (seed repeats, width ladder,
    top-k full-size targets, fidelity escalation, fallback targets when the target regresses), driven by the
    policy's own decisions;
  * Hydro "auto": the scale measured as ``HydroSearcher(scale="auto")`` measures it (``hydro.trial.scale_plan``:
    the finest of S=8, 4, 2 whose fused step costs at most 2.5 times the S=8 one's, a choice of S=8 checked by
    its pilot against S=4; the measuring's and the pilot's CPU time counted), then the policy's defaults with
    every rung trained whole (``halving=False``, as every variant not named "+halving");
  * the same with rung halving ("+halving"): each rung's fused trial stops members at the policy's milestones as a
    rung trial does (``Trainer.halved``);
  * the policy's defaults themselves ("+halving-auto", ``halving="auto"``): the search also records each member's
    validation metric at the rungs' milestone epochs, and the rungs halve where the search driver's rule
    (``schedulers.halving_choice.auto_halving``) says so on those curves; the decision and why are in the JSON;
  * the same with the user's early stopping in the search ("+asha"): the search's members stopped by ASHA (grace
    period 1, reduction factor 2, as stock + ASHA; ``HydroSearcher(scheduler=ASHAScheduler(...))``), the stages
    after it ranking them as the search driver does (by their last value, whatever epoch a stopped one reached);
    "auto+halving-auto+asha" searches at the scale "auto" measures without regard to the early stopping, where
    ``HydroSearcher(scale="auto")`` with a scheduler searches at S=8 (``schedulers.scale_choice.auto_scales``),
    as "S=8 ladder+escalate-probe+fallback-2+halving-auto+asha" does.
Each variant's planned cost of the stages after the search (``plan_cost``) and what it trained, the search
included (``trained_cost``), in full-size trainings, are in the JSON.
Reported: the target's validation metric against stock's best ("shortfall"; and a few full-size seeds of
stock's top configuration, the noise), the returned configuration's own stock score against stock's best
("config": the choice, without the target training's noise), the target against the mean of stock's top
configuration trained as Hydro's full-size target (µP, the user's model itself) over the same seeds ("vs µP":
without the target training's noise, the member's initialisation seed differing from stock's), the returned
configuration's own mean over those seeds against it ("expected": both configurations trained the same way on the
same seeds, so neither the target's seed nor the maximum over N noisy stock runs decides), Spearman rank
correlation of the search's surrogate scores with the full-size ones over the N configurations, the transfer
check of the remedies, and time (each variant's speed-up against stock + ASHA, the default baseline, and against
stock without early stopping); and, apart from the variants, every configuration trained at S=8, 4 and 2 (one
fused trial each): each scale's Spearman against stock's full-size scores and where stock's best ranks there,
how far down the widths transfer holds on the workload. Training runs in this process with
``hydro.trial.FusedTrial`` (no Ray: the same unit Ray trials run, without scheduling overheads), one torch
thread, one training at a time. Time is the process CPU time of the trainings: with one thread it is the wall
time of an idle machine, and a shared machine's load inflates it less (two runs sharing the 2-core machine
measured the same decisions up to a third apart); the JSON keeps the load average at the start and end of stock
and of each variant (a ``--reuse`` run keeps the earlier ones', with their times). Writes
``transfer_fidelity.json`` and ``transfer_fidelity.png`` to ``--out``.

    python -m benchmarks.transfer_fidelity [--workloads mlp,resmlp,cnn,lm] [--samples 16] [--quick]
                                           [--variants "S=4,S=8"] [--readout-init zero|mup] [--reuse]
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import torch
from ray import tune
from torch import Tensor, nn

from hydro.examples.models import CharTransformerLM
from hydro.trial.plan import TARGET_MEMBER_ID, TrialKind, TrialPlan
from hydro.trial.data import Batch
from hydro.trial.scale_plan import measured_scale, piloted_scale
from hydro.trial.spec import TuneSpec, accuracy
from hydro.trial.unit import FusedTrial
from hydro.tune.examples import char_lm, digits_cnn, digits_mlp
from hydro.tune.search.random_search import RandomSearch
from schedulers.halving_choice import auto_halving, reads_curves
from schedulers.member_stopping import ASHA, MemberStopping, score
from schedulers.rung_halving import RungHalving, milestones
from schedulers.scale_choice import PILOT_CONFIGS
from schedulers.transfer import AUTO, Disagreement, RungKind, Score, TransferPolicy, scores_of, spearman

NOISE_SEEDS = (1, 2)  # extra full-size seeds of stock's top configuration
TABLE_SCALES = (8, 4, 2)  # every configuration is also trained at each of these scales: how well each one ranks


# --- workloads ------------------------------------------------------------------------------------------------

class ResidualMLP(nn.Module):
    """Pre-LN residual MLP ``[N, features] -> [N, classes]``: input projection, ``blocks`` of
    ``x + W2 gelu(W1 LayerNorm(x))`` (hidden 2x width), final LayerNorm and readout."""

    def __init__(self, features: int, width: int, classes: int, blocks: int = 2) -> None:
        super().__init__()
        self.inp = nn.Linear(features, width)
        self.norms = nn.ModuleList(nn.LayerNorm(width) for _ in range(blocks))
        self.ups = nn.ModuleList(nn.Linear(width, 2 * width) for _ in range(blocks))
        self.downs = nn.ModuleList(nn.Linear(2 * width, width) for _ in range(blocks))
        self.final = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.inp(x)
        for norm, up, down in zip(self.norms, self.ups, self.downs):
            h = h + down(nn.functional.gelu(up(norm(h))))
        return self.head(self.final(h))


def synthetic_tabular(train: int = 1500, val: int = 3000, features: int = 32, classes: int = 10) -> tuple[Batch, Batch]:
    """A 10-class task labelled by a random tanh teacher with Gumbel label noise: few training samples for a
    wide model, so it overfits (features ``[N, 32]`` float, labels ``[N]``)."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(train + val, features, generator=g)
    w1, w2 = torch.randn(features, 64, generator=g) / features ** 0.5, torch.randn(64, classes, generator=g) / 8 ** 0.5
    logits = torch.tanh(x @ w1) @ w2 * 4
    noise = -torch.log(-torch.log(torch.rand(logits.shape, generator=g)))
    y = (logits + noise).argmax(1)
    return (x[:train], y[:train]), (x[train:], y[train:])


def _residual_mlp(width: int, config) -> nn.Module:
    return ResidualMLP(32, width, 10)


def _adamw_beta1(params, config) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=config["lr"], weight_decay=config["weight_decay"],
                             betas=(config["beta1"], 0.999))


def residual_mlp(epochs: int, width: int) -> tuple[TuneSpec, dict]:
    spec = TuneSpec(model=functools.partial(_residual_mlp, width), data=synthetic_tabular,
                    loss=nn.CrossEntropyLoss(), optimizer=_adamw_beta1, metric="val_acc", mode="max",
                    metrics={"val_acc": accuracy}, epochs=epochs, batch_size=64)
    return spec, {"lr": tune.loguniform(1e-5, 3e-2), "weight_decay": tune.loguniform(1e-3, 0.3),
                  "beta1": tune.uniform(0.8, 0.98)}


def _char_lm_8_heads(config) -> nn.Module:
    return CharTransformerLM(vocab_size=128, d_model=64, nhead=8, num_layers=2, dim_feedforward=256, max_len=32)


def char_lm_8_heads(epochs: int) -> tuple[TuneSpec, dict]:
    """``hydro.tune.examples.char_lm`` with 8 heads of dimension 8 (µP keeps the head dimension: S=8 leaves one)."""
    spec, space = char_lm(epochs)
    return dataclasses.replace(spec, model=_char_lm_8_heads), space


@dataclass
class Workload:
    name: str
    kind: str
    make: Callable[[bool], tuple[TuneSpec, dict]]


WORKLOADS = {w.name: w for w in [
    Workload("mlp", "SGD MLP 64-512-512-10, digits", lambda q: digits_mlp(epochs=3 if q else 8, hidden=256 if q else 512)),
    Workload("resmlp", "AdamW pre-LN residual MLP (width 256) on noisy synthetic tabular data, overfitting",
             lambda q: residual_mlp(epochs=3 if q else 10, width=128 if q else 256)),
    Workload("resmlp-wide", "AdamW pre-LN residual MLP (width 1024), as resmlp at a size where stock takes minutes",
             lambda q: residual_mlp(epochs=3 if q else 8, width=256 if q else 1024)),
    Workload("cnn", "SGD CNN 64/128 channels with BatchNorm, 8x8 digits", lambda q: digits_cnn(epochs=2 if q else 5)),
    Workload("lm", "AdamW char Transformer LM (d=64, 8 heads, 2 layers), stdlib source", lambda q: char_lm_8_heads(epochs=1)),
]}


# --- training ---------------------------------------------------------------------------------------------------

@dataclass
class Trainer:
    """Trains plans of one workload in this process, one at a time; ``seconds``: the CPU time they took."""

    spec: TuneSpec
    data: tuple[Batch, Batch]
    seconds: float = 0.0

    def run(self, plan: TrialPlan, spec: TuneSpec | None = None) -> dict[str, float]:
        """Train ``plan`` for the spec's epochs; the members' final validation metric (member id -> value)."""
        return self.curves(plan, (), spec)[0]

    def curves(self, plan: TrialPlan, at: Collection[int],
               spec: TuneSpec | None = None) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
        """Train ``plan`` for the spec's epochs, also evaluated after each epoch in ``at`` (evaluating does not
        change training: ``FusedTrial.evaluate`` leaves its random streams as they were). Returns the members'
        final validation metric (member id -> value) and, per epoch of ``at`` below the last, theirs after it."""
        spec = spec or self.spec
        start = time.process_time()
        trial = FusedTrial(spec, plan, self.data)
        after: dict[int, dict[str, float]] = {}
        for epoch in range(1, spec.epochs + 1):
            trial.train_epoch()
            if epoch in at and epoch < spec.epochs:
                after[epoch] = dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist()))
        values = trial.evaluate()[spec.metric].tolist()
        self.seconds += time.process_time() - start
        return dict(zip(trial.member_ids, values)), after

    def surrogates(self, configs: dict[str, dict], scale: int, seeds: int,
                   at: Collection[int] = ()) -> tuple[dict[str, Score], dict[str, dict[int, float]]]:
        """Each configuration ``seeds`` times (members ``<id>#<seed>`` differ in their initialisation) in one
        fused trial of µP surrogates at ``scale``. Returns their scores and each configuration's curve: {epoch of
        ``at`` below the spec's epochs: its seeds' mean validation metric after it}."""
        config_of = {f"{c}#{s}": c for c in configs for s in range(seeds)}
        members = [(m, configs[c]) for m, c in config_of.items()]
        values, after = self.curves(TrialPlan(TrialKind.SURROGATE, members, scale, mup=True), at)
        curves: dict[str, dict[int, float]] = {c: {} for c in configs}
        for epoch, then in after.items():
            for c, s in scores_of((config_of[m], v) for m, v in then.items()).items():
                curves[c][epoch] = s.mean
        return scores_of((config_of[m], v) for m, v in values.items()), curves

    def stopped(self, configs: dict[str, dict], scale: int,
                stopping: MemberStopping) -> tuple[dict[str, Score], dict[str, dict[int, float]], int]:
        """The configurations in one fused trial of µP surrogates at ``scale`` (one seed), evaluated after every
        epoch, each member stopped when ``stopping`` says so (as a search trial asks the run's per-member stopping
        service, member by member, and drops the stopped ones: ``FusedTrial.keep``). Returns their scores, each
        measured after the epoch it stopped at (``Score.reached``), each one's curve (epoch -> its metric after it,
        below the last epoch) and the member-epochs trained."""
        spec, start = self.spec, time.process_time()
        trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, list(configs.items()), scale, mup=True), self.data)
        values, reached, member_epochs = {}, {}, 0
        curves: dict[str, dict[int, float]] = {c: {} for c in configs}
        for epoch in range(1, spec.epochs + 1):
            member_epochs += len(trial.member_ids)
            trial.train_epoch()
            now = dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist()))
            values.update(now)
            reached.update(dict.fromkeys(now, epoch))
            final = epoch == spec.epochs
            if not final:
                for m, v in now.items():
                    curves[m][epoch] = v
            stop = {m for m, v in now.items() if stopping.decide(m, epoch, v, final=final)}
            if stop and not final:
                trial.keep([i for i, m in enumerate(trial.member_ids) if m not in stop])
        self.seconds += time.process_time() - start
        return scores_of(values.items(), reached), curves, member_epochs

    def halved(self, configs: dict[str, dict], scale: int, halving: RungHalving) -> tuple[dict[str, Score], int]:
        """The configurations in one fused trial of µP surrogates at ``scale`` (one seed) that stops members at
        ``halving``'s milestones as a rung trial does (``MemberSession.step``, ``FusedTrial.keep``); their scores,
        each measured after the epoch it stopped at, and the member-epochs trained."""
        spec, start = self.spec, time.process_time()
        trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, list(configs.items()), scale, mup=True), self.data)
        values, reached, member_epochs = {}, {}, 0
        for epoch in range(1, spec.epochs + 1):
            member_epochs += len(trial.member_ids)
            trial.train_epoch()
            if not halving.evaluates(epoch, spec.epochs):
                continue
            now = dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist()))
            values.update(now)
            reached.update(dict.fromkeys(now, epoch))
            stop = set() if epoch == spec.epochs else halving.stops(epoch, {m: score(v, spec.mode)
                                                                            for m, v in now.items()})
            if stop:
                trial.keep([i for i, m in enumerate(trial.member_ids) if m not in stop])
        self.seconds += time.process_time() - start
        return scores_of(values.items(), reached), member_epochs

    def target(self, config: dict, mup: bool, seed: int | None = None) -> float:
        """``config`` at full size as Hydro's target trains it (``seed``: the spec's unless given)."""
        spec = self.spec if seed is None else dataclasses.replace(self.spec, seed=seed)
        return self.run(TrialPlan(TrialKind.TARGET, [(TARGET_MEMBER_ID, config)], mup=mup), spec)[TARGET_MEMBER_ID]


def stock(trainer: Trainer, configs: dict[str, dict]) -> dict[str, float]:
    """Every configuration at full size, as written (a stock Ray Tune trial)."""
    return {c: trainer.run(TrialPlan(TrialKind.PLAIN, [(c, config)]))[c] for c, config in configs.items()}


ASHA_REDUCTION_FACTOR = 2  # stock + ASHA's: successive halving, rungs at 1, 2, 4, ... epochs


def stock_asha(trainer: Trainer, configs: dict[str, dict]) -> dict:
    """Every configuration at full size as written, one at a time in ``configs``' order, evaluated after each
    epoch and stopped by ASHA (grace period 1, reduction factor ``ASHA_REDUCTION_FACTOR``, at the spec's epochs).
    Returns ``seconds`` (CPU time, evaluations included), ``scores`` (each configuration's last score),
    ``epochs`` (each one's epochs trained) and ``best`` (the configuration with the best last score)."""
    spec = trainer.spec
    rule = ASHA(max_t=spec.epochs, grace_period=1, reduction_factor=ASHA_REDUCTION_FACTOR)
    start = time.process_time()
    scores, epochs = {}, {}
    for c, config in configs.items():
        trial = FusedTrial(spec, TrialPlan(TrialKind.PLAIN, [(c, config)]), trainer.data)
        for epoch in range(1, spec.epochs + 1):
            trial.train_epoch()
            scores[c], epochs[c] = float(trial.evaluate()[spec.metric][0]), epoch
            if rule.on_result(c, epoch, score(scores[c], spec.mode)):
                break
    sign = -1 if spec.mode == "max" else 1
    return {"seconds": time.process_time() - start, "scores": scores, "epochs": epochs,
            "best": min(scores, key=lambda c: sign * scores[c])}


def hydro_run(trainer: Trainer, configs: dict[str, dict], policy: TransferPolicy,
              targets: dict[str, tuple[float, float]], search_asha: bool = False) -> dict:
    """Hydro's search at ``policy.scale`` and the stages the policy decides; ``targets`` caches full-size
    trainings (config id -> (value, seconds)), which are deterministic, across runs. A policy whose ``halving`` is
    :data:`~schedulers.transfer.AUTO` is resolved as the search driver resolves it, from the search's curves
    (:func:`~schedulers.halving_choice.auto_halving`); the result's ``halving_choice`` records the decision.
    ``search_asha``: the search's members stopped by ASHA as stock + ASHA's trials are (``HydroSearcher(...,
    scheduler=ASHAScheduler(...))``; one seed), the stages after it as the policy decides."""
    start, epochs = trainer.seconds, trainer.spec.epochs
    auto = policy.halving == AUTO
    if search_asha:
        if policy.seeds != 1:
            raise ValueError("search_asha: a search stopped by ASHA trains one seed per configuration")
        rule = ASHA(max_t=epochs, grace_period=1, reduction_factor=ASHA_REDUCTION_FACTOR)
        stopped, curves, search_epochs = trainer.stopped(configs, policy.scale, MemberStopping(rule, policy.mode))
        final = {c: s.mean for c, s in stopped.items() if s.reached == epochs}  # the members that trained every epoch
        search = scores_of((c, s.mean) for c, s in stopped.items())  # ranked by last value, whatever epoch, as the
        # search driver ranks its search (docs/tuner-and-transfer.md#per-member-early-stopping)
    else:
        search, curves = trainer.surrogates(configs, policy.scale, policy.seeds,
                                            milestones(epochs, policy.eta) if auto and reads_curves(policy) else ())
        search_epochs = len(configs) * policy.seeds * epochs
        final = {c: s.mean for c, s in search.items()}
    stages = [search]
    choice = auto_halving(policy, curves, final) if auto else None
    if choice is not None:
        policy = dataclasses.replace(policy, halving=choice.halving)
    trained: list[str] = []  # at full size: the targets, then any fallback targets
    member_epochs = search_epochs / policy.scale ** 2  # full-size member-epochs, the search's
    while (rung := policy.next_rung(stages)) is not None:
        if rung.scale > 1:
            rung_configs = {c: configs[c] for c in rung.configs}
            halving = RungHalving.plan(len(rung.configs), rung.survivors, epochs, policy.eta) \
                if rung.survivors else None
            if halving is None:
                stages.append(trainer.surrogates(rung_configs, rung.scale, rung.seeds)[0])
                trained_epochs = len(rung.configs) * rung.seeds * epochs
            else:
                scores, trained_epochs = trainer.halved(rung_configs, rung.scale, halving)
                stages.append(scores)
            member_epochs += trained_epochs / rung.scale ** 2
            continue
        member_epochs += len(rung.configs) * epochs
        for c in rung.configs:
            if c not in targets:
                before = trainer.seconds
                targets[c] = (trainer.target(configs[c], mup=policy.scale > 1), trainer.seconds - before)
                start += targets[c][1]  # counted from the cache below
        trained += rung.configs
        stages.append({c: Score(targets[c][0], 0.0, 1) for c in rung.configs})
    surrogate_seconds = trainer.seconds - start
    target_seconds = sum(targets[c][1] for c in trained)
    rungs = policy.rungs(stages)
    first = next((i for i, r in enumerate(rungs) if r.scale == 1), len(rungs))  # the first targets' stage
    returned = policy.returned(stages)
    return {"seconds": surrogate_seconds + target_seconds, "target_seconds": target_seconds, "returned": returned,
            "target": policy.by_scale(stages)[-1][1][returned].mean,
            "cost_up_front": policy.describe(len(configs)),
            "plan_cost": policy.cost(len(configs)),  # the stages after the search, as planned (full-size trainings)
            "trained_cost": member_epochs / epochs,  # all it trained, the search included (full-size trainings)
            "trail": [(s, vars(score)) for s, score in policy.trail(stages, returned)],
            "checks": [vars(c) for c in policy.checks(stages)],
            "regression": None if (r := policy.regression(stages[:first + 2])) is None else vars(r),
            "escalation": next((r.why for r in rungs if r.kind == RungKind.ESCALATION), None),
            "fallback": [c for r in rungs if r.kind == RungKind.FALLBACK for c in r.configs],
            "search_scores": {c: s.mean for c, s in stages[0].items()},
            "halving_choice": None if choice is None else {
                "halving": choice.halving, "reason": choice.reason,
                "agreements": [vars(a) for a in choice.agreements]}}


# --- the benchmark ----------------------------------------------------------------------------------------------

# the best surrogate's alone; a variant that escalates does so on a confident disagreement unless it says "likely"
# or "probe"; a target regresses when it does 1% worse than its surrogate unless the variant says otherwise; rungs
# train whole unless it says "+halving" (every rung halves) or "+halving-auto" (TransferPolicy's default: chosen
# from the search's curves); the search trains every member for every epoch unless it says "+asha" (its members
# stopped by ASHA as stock + ASHA's trials are: SEARCH_ASHA_VARIANTS)
PLAIN = {"ladder": False, "top_k": 1, "seeds": 1, "escalate": False, "disagreement": Disagreement.CONFIDENT,
         "fallback_targets": 0, "max_target_drop": 0.01, "halving": False}
VARIANTS = {name: {**PLAIN, **options} for name, options in {
    "S=2": {"scale": 2},
    "S=4": {"scale": 4},
    "S=8": {"scale": 8},
    "S=8 seeds=3": {"scale": 8, "seeds": 3},
    "S=8 ladder": {"scale": 8, "ladder": True},  # TransferPolicy's default ladder, rungs whole
    "S=8 top-3": {"scale": 8, "top_k": 3},
    "S=8 ladder+seeds=2+top-2": {"scale": 8, "ladder": True, "seeds": 2, "top_k": 2},
    "S=8 ladder+top-2": {"scale": 8, "ladder": True, "top_k": 2},
    "S=4 ladder+top-2": {"scale": 4, "ladder": True, "top_k": 2},
    "S=4 seeds=3": {"scale": 4, "seeds": 3},
    "S=4 ladder": {"scale": 4, "ladder": True},  # TransferPolicy's default ladder, rungs whole
    "S=4 top-3": {"scale": 4, "top_k": 3},
    "S=4 ladder+seeds=2+top-2": {"scale": 4, "ladder": True, "seeds": 2, "top_k": 2},
    "S=8 ladder+fallback-1": {"scale": 8, "ladder": True, "fallback_targets": 1},
    "S=8 ladder+fallback-2": {"scale": 8, "ladder": True, "fallback_targets": 2},
    "S=8 ladder+escalate": {"scale": 8, "ladder": True, "escalate": True},
    "S=8 ladder+escalate+fallback-2": {"scale": 8, "ladder": True, "escalate": True, "fallback_targets": 2},
    "S=8 ladder+escalate-likely+fallback-2": {"scale": 8, "ladder": True, "escalate": True, "fallback_targets": 2,
                                              "disagreement": Disagreement.LIKELY},
    "S=8 ladder+escalate-probe+fallback-2": {"scale": 8, "ladder": True, "escalate": True, "fallback_targets": 2,
                                             "disagreement": Disagreement.PROBE},  # the defaults, rungs whole
    "S=8 ladder+escalate-probe+fallback-2 on 2 slots": {"scale": 8, "ladder": True, "escalate": True,
                                                        "fallback_targets": 2, "disagreement": Disagreement.PROBE,
                                                        "slots": 2},  # HydroSearcher's on 2 CPU trial slots
    "S=8 ladder+escalate-probe+fallback-2-at-0.5%": {"scale": 8, "ladder": True, "escalate": True,
                                                     "fallback_targets": 2, "disagreement": Disagreement.PROBE,
                                                     "max_target_drop": 0.005},
    "S=8 ladder-eta-2+escalate-probe+fallback-2": {"scale": 8, "ladder": True, "eta": 2, "escalate": True,
                                                   "fallback_targets": 2, "disagreement": Disagreement.PROBE},
    "S=8 ladder+fallback-3": {"scale": 8, "ladder": True, "fallback_targets": 3},
    "S=4 ladder+fallback-2": {"scale": 4, "ladder": True, "fallback_targets": 2},
    "S=8 fallback-2": {"scale": 8, "fallback_targets": 2},
    "S=4 fallback-2": {"scale": 4, "fallback_targets": 2},
    "auto": {"scale": AUTO, "ladder": True, "escalate": True, "fallback_targets": 2,  # HydroSearcher(scale="auto")
             "disagreement": Disagreement.PROBE},  # the defaults, rungs whole, at the scale it measures
    "S=8 ladder+escalate-probe+fallback-2+halving": {"scale": 8, "ladder": True, "escalate": True,
                                                     "fallback_targets": 2, "disagreement": Disagreement.PROBE,
                                                     "halving": True},  # the defaults, rungs halving over epochs
    "auto+halving": {"scale": AUTO, "ladder": True, "escalate": True, "fallback_targets": 2,
                     "disagreement": Disagreement.PROBE, "halving": True},
    "S=8 ladder+escalate-probe+fallback-2+halving-auto": {"scale": 8, "ladder": True, "escalate": True,
                                                          "fallback_targets": 2, "disagreement": Disagreement.PROBE,
                                                          "halving": AUTO},  # TransferPolicy's defaults
    "auto+halving-auto": {"scale": AUTO, "ladder": True, "escalate": True, "fallback_targets": 2,
                          "disagreement": Disagreement.PROBE, "halving": AUTO},  # HydroSearcher(scale="auto")'s
    "S=8 ladder+escalate-probe+fallback-2+halving-auto+asha": {
        "scale": 8, "ladder": True, "escalate": True, "fallback_targets": 2, "disagreement": Disagreement.PROBE,
        "halving": AUTO},
    "auto+halving-auto+asha": {"scale": AUTO, "ladder": True, "escalate": True, "fallback_targets": 2,
                               "disagreement": Disagreement.PROBE, "halving": AUTO},
}.items()}
SEARCH_ASHA_VARIANTS = frozenset({  # the search's members stopped by ASHA (HydroSearcher(scheduler=ASHAScheduler(...)))
    "S=8 ladder+escalate-probe+fallback-2+halving-auto+asha", "auto+halving-auto+asha"})


def shortfall(spec: TuneSpec, value: float, reference: float) -> float:
    """How much worse ``value`` is than ``reference`` (positive: worse): absolute for accuracy-like metrics
    (``mode="max"``), relative for losses."""
    return reference - value if spec.mode == "max" else (value - reference) / abs(reference)


def scale_agreement(spec: TuneSpec, by_scale: dict[str, dict[str, float]], full: dict[str, float],
                    top: str) -> dict[str, dict[str, float]]:
    """Per surrogate scale, how its ranking of every configuration agrees with stock's full-size one: Spearman
    ``rho`` over the configurations scored at both, and ``best_rank``, where stock's best configuration ranks there
    (1: first; ``None`` if it has no score there)."""
    sign = -1 if spec.mode == "max" else 1
    agreement = {}
    for scale, scores in by_scale.items():
        common = [c for c in scores if c in full]
        ranked = sorted(scores, key=lambda c: sign * scores[c])
        agreement[scale] = {"rho": spearman([scores[c] for c in common], [full[c] for c in common]),
                            "best_rank": ranked.index(top) + 1 if top in scores else None}
    return agreement


def measure(workload: Workload, samples: int, variants: list[str], quick: bool, seed: int,
            previous: dict | None, readout_zero_init: bool | None = None) -> dict:
    """Stock and the ``variants`` on one workload; ``previous``: this workload's result of an earlier run, whose
    stock trainings (and other variants) are reused when it drew the same configurations (they are
    deterministic). ``readout_zero_init``: the surrogates' readout init (``None``: ``hydro.shrink``'s default;
    the full-size target has the model's own)."""
    spec, space = workload.make(quick)
    spec = dataclasses.replace(spec, shrink_readout_zero_init=readout_zero_init)
    drawn = RandomSearch(space, seed=seed)
    configs = {f"c{i:02d}": drawn.suggest(str(i)) for i in range(samples)}
    trainer = Trainer(spec, spec.load_data())
    reused = previous is not None and previous["configs"] == configs
    if reused:
        full, stock_seconds, top = previous["stock"]["scores"], previous["stock"]["seconds"], previous["stock"]["best"]
        noise_score, runs = Score(**previous["stock"]["best_seeds"]), dict(previous["runs"])
        stock_load = previous["stock"].get("load")
    else:
        stock_load = [os.getloadavg()[0]]
        full = stock(trainer, configs)
        stock_seconds = trainer.seconds
        stock_load.append(os.getloadavg()[0])
        sign = -1 if spec.mode == "max" else 1
        top = min(full, key=lambda c: sign * full[c])
        noise_score = Score.of([full[top]] + [trainer.run(TrialPlan(TrialKind.PLAIN, [(top, configs[top])]),
                                                          dataclasses.replace(spec, seed=s))[top] for s in NOISE_SEEDS])
        runs = {}
    if reused and "best_mup" in previous["stock"]:
        mup_score = Score(**previous["stock"]["best_mup"])
    else:  # the parametrization's share of a shortfall: stock's best configuration as Hydro's target trains it
        mup_score = Score.of([trainer.target(configs[top], mup=True, seed=s) for s in (spec.seed, *NOISE_SEEDS)])
    print(f"[{workload.name}] stock: {stock_seconds:.0f} s, best {top} {full[top]:.4f}; its seeds {noise_score}; "
          f"as a µP target {mup_score}", flush=True)
    if reused and "asha" in previous["stock"]:
        asha = previous["stock"]["asha"]
    else:
        load = os.getloadavg()[0]
        asha = stock_asha(trainer, configs)
        asha["load"] = [load, os.getloadavg()[0]]
        asha["epochs_per_config"] = sum(asha["epochs"].values()) / len(asha["epochs"])
        asha["shortfall"] = shortfall(spec, full[asha["best"]], full[top])  # its choice, as stock trained it
    print(f"[{workload.name}] stock + ASHA: {asha['seconds']:.0f} s, {asha['epochs_per_config']:.1f} epochs per "
          f"configuration, best {asha['best']} (stock's score {full[asha['best']]:.4f})", flush=True)
    by_scale = previous["stock"]["by_scale"] if reused and "by_scale" in previous["stock"] else {
        str(scale): {c: score.mean for c, score in trainer.surrogates(configs, scale, 1)[0].items()}
        for scale in TABLE_SCALES}
    targets = {}
    for name in variants:
        load = os.getloadavg()[0]
        options, choice, start = VARIANTS[name], None, time.process_time()
        if options["scale"] == AUTO:  # measured in this process, its time counted in the run's
            choice = measured_scale(spec, configs[next(iter(configs))], trainer.data, samples, threads=1)
            pilot = RandomSearch(space, seed=0)  # HydroSearcher's pilot configurations
            choice = piloted_scale(spec, choice, [pilot.suggest(f"pilot{i}") for i in range(PILOT_CONFIGS)],
                                   trainer.data, samples, threads=1)
            options = {**options, "scale": choice.scale}
        measuring = time.process_time() - start
        policy = TransferPolicy(1.0, samples, spec.metric, spec.mode, epochs=spec.epochs, **options)
        run = hydro_run(trainer, configs, policy, targets, search_asha=name in SEARCH_ASHA_VARIANTS)
        run["seconds"] += measuring
        if choice is not None:
            run["scale_choice"] = {"scale": choice.scale, "step_s": choice.step_s, "reason": choice.reason,
                                   "seconds": measuring}
        run["load"] = [load, os.getloadavg()[0]]  # its time's conditions: a --reuse run keeps earlier variants'
        run["speedup"] = stock_seconds / run["seconds"]  # against stock without early stopping
        run["shortfall"] = shortfall(spec, run["target"], full[top])
        common = list(configs)
        run["spearman_search_vs_full"] = spearman([run["search_scores"][c] for c in common], [full[c] for c in common])
        run["low_check"] = any(c["low"] for c in run["checks"]) or run["regression"] is not None
        runs[name] = run
        chosen = run["halving_choice"]
        said = "" if chosen is None else f"; rung halving {'on' if chosen['halving'] else 'off'}: {chosen['reason']}"
        print(f"[{workload.name}] {name}: {run['seconds']:.0f} s ({run['speedup']:.1f}x), target {run['target']:.4f} "
              f"({run['returned']}), shortfall {run['shortfall']:+.4f}, Spearman {run['spearman_search_vs_full']:.2f}"
              f"{said}", flush=True)
    # Each returned configuration's expected full-size score: trained as Hydro's target over the seeds stock's best
    # was measured on (the spec's and NOISE_SEEDS), as ``mup_score`` is for stock's best configuration.
    expected = {c: Score(**v) for c, v in previous["stock"].get("expected", {}).items()} if reused else {}
    expected[top] = mup_score
    for run in runs.values():
        c = run["returned"]
        if c not in expected:
            first = targets[c][0] if c in targets else trainer.target(configs[c], mup=True)
            expected[c] = Score.of([first] + [trainer.target(configs[c], mup=True, seed=s) for s in NOISE_SEEDS])
    for run in runs.values():  # the returned configuration as stock trained it: the choice, without target noise
        run["speedup_vs_asha"] = asha["seconds"] / run["seconds"]
        run["config_shortfall"] = shortfall(spec, full[run["returned"]], full[top])
        run["shortfall_mup"] = shortfall(spec, run["target"], mup_score.mean)
        mine = expected[run["returned"]]
        run["expected"] = vars(mine)
        run["expected_shortfall"] = shortfall(spec, mine.mean, mup_score.mean)
        # the difference of the two means' standard error, in the shortfall's units
        error = math.sqrt(mine.spread ** 2 / mine.count + mup_score.spread ** 2 / mup_score.count)
        run["expected_shortfall_se"] = error if spec.mode == "max" else error / abs(mup_score.mean)
    return {"kind": workload.kind, "metric": spec.metric, "mode": spec.mode, "epochs": spec.epochs,
            "configs": configs, "stock": {"seconds": stock_seconds, "load": stock_load, "scores": full, "best": top,
                                          "asha": asha,
                                          "best_value": full[top], "best_seeds": vars(noise_score),
                                          "best_mup": vars(mup_score), "by_scale": by_scale,
                                          "by_scale_vs_full": scale_agreement(spec, by_scale, full, top),
                                          "expected": {c: vars(score) for c, score in expected.items()}},
            "runs": runs}


def report(results: dict) -> None:
    print(f"\n{results['samples']} configurations per workload; in-process, 1 torch thread, trainings one at a "
          f"time; load average {results['load_start']:.1f} at the start, {results['load_end']:.1f} at the end "
          f"({results['cpus']} CPUs); surrogates' readout init: {results['readout_init'] or 'hydro.shrink default'}")
    for name, res in results["workloads"].items():
        stock_res = res["stock"]
        noise = stock_res["best_seeds"]
        print(f"\n[{name}] {res['kind']}; {res['metric']} ({res['mode']}), {res['epochs']} epochs")
        print(f"  stock: {stock_res['seconds']:.0f} s, best {stock_res['best_value']:.4f}; its config over "
              f"{noise['count']} seeds {noise['mean']:.4f} ± {noise['spread']:.4f}, as a µP target "
              f"{stock_res['best_mup']['mean']:.4f} ± {stock_res['best_mup']['spread']:.4f}")
        asha = stock_res["asha"]
        print(f"  stock + ASHA (grace 1, reduction factor {ASHA_REDUCTION_FACTOR}): {asha['seconds']:.0f} s, "
              f"{asha['epochs_per_config']:.1f} epochs per configuration, its choice's shortfall "
              f"{asha['shortfall']:+.4f}")
        print("  each scale's ranking of all configurations against stock's: " + ", ".join(
            f"S={scale} Spearman {a['rho']:.2f}, stock's best ranks {a['best_rank']}"
            for scale, a in stock_res["by_scale_vs_full"].items()))
        print(f"  {'variant':<30} {'CPU s':>7} {'vs ASHA':>8} {'vs stock':>8} {'target':>8} {'shortfall':>9} {'config':>7} "
              f"{'vs µP':>7} {'expected ± se':>16} {'Spearman':>8} {'checks (rho)':>14} {'warns':>5} "
              f"{'escalated, fallback':>20}  trail (scale: score)")
        for variant, run in res["runs"].items():
            checks = ",".join(f"{c['rho']:.2f}" for c in run["checks"] if c["configs"] >= 3) or "-"
            trail = " -> ".join(f"{s}: {v['mean']:.4f}" for s, v in run["trail"])
            extra = ",".join((["escalated"] if run.get("escalation") else []) + run.get("fallback", [])) or "-"
            print(f"  {variant:<30} {run['seconds']:7.0f} {run['speedup_vs_asha']:7.1f}x {run['speedup']:7.1f}x "
                  f"{run['target']:8.4f} "
                  f"{run['shortfall']:+9.4f} {run['config_shortfall']:+7.4f} "
                  f"{run['shortfall_mup']:+7.4f} {run['expected_shortfall']:+8.4f} ± {run['expected_shortfall_se']:.4f} "
                  f"{run['spearman_search_vs_full']:8.2f} {checks:>14} "
                  f"{'yes' if run['low_check'] else 'no':>5} {extra:>20}  {trail}")


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    markers = "os^vDP*Xhp<>"
    variants = list(dict.fromkeys(v for res in results["workloads"].values() for v in res["runs"]))  # reused ones too
    for name, res in results["workloads"].items():
        line = None
        for variant, run in res["runs"].items():
            marker = markers[variants.index(variant) % len(markers)]
            points = ax.scatter(run["speedup_vs_asha"], 100 * run["shortfall"], marker=marker,
                                color=line.get_facecolor() if line is not None else None,
                                label=f"{name}: {variant}")
            line = line or points
    ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.axhline(0.0, color="black", linewidth=0.5)
    ax.set_xlabel("speed-up over stock full-size search with ASHA (CPU time, 1 thread)")
    ax.set_ylabel("target shortfall vs stock's best (points, or % of loss)")
    ax.set_title("Transfer fidelity: Hydro's returned configuration at full size")
    ax.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp,resmlp,cnn,lm", help=f"comma-separated subset of {list(WORKLOADS)}")
    variants_help = (f"comma-separated subset of {list(VARIANTS)}; empty: none (with --reuse, the earlier ones "
                     f"are kept and only what they lack is measured)").replace("%", "%%")  # argparse %-formats help
    parser.add_argument("--variants", default=",".join(VARIANTS), help=variants_help)
    parser.add_argument("--samples", type=int, default=16, help="configurations per workload")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="smaller models, fewer epochs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--readout-init", choices=["zero", "mup"],
                        help="the surrogates' readout init: zero, or mup's default ×sqrt(width_mult) (default: "
                             "hydro.shrink's)")
    parser.add_argument("--reuse", action="store_true",
                        help="reuse the stock trainings and other variants of the JSON this run would write")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS] + [w for w in args.workloads.split(",") if w not in WORKLOADS]
    if unknown:
        parser.error(f"unknown variants/workloads {unknown}; choose from {list(VARIANTS)} and {list(WORKLOADS)}")
    torch.set_num_threads(1)
    readout_zero_init = None if args.readout_init is None else args.readout_init == "zero"
    results = {"samples": args.samples, "seed": args.seed, "quick": args.quick, "readout_init": args.readout_init,
               "cpus": os.cpu_count(),
               "load_start": os.getloadavg()[0], "machine": platform.machine(), "torch": torch.__version__,
               "workloads": {}}
    stem = "transfer_fidelity" + ("_" + args.workloads.replace(",", "_") if args.workloads != parser.get_default("workloads") else "")
    if args.reuse and not (args.out / f"{stem}.json").is_file():
        parser.error(f"--reuse: there is no {args.out / f'{stem}.json'} (the same --out and --workloads) to reuse; "
                     f"run once without --reuse")
    earlier = json.loads((args.out / f"{stem}.json").read_text()) if args.reuse else {}
    if earlier and (earlier["samples"], earlier["seed"], earlier["quick"]) != (args.samples, args.seed, args.quick):
        parser.error(f"--reuse: {args.out / f'{stem}.json'} was measured with other --samples/--seed/--quick")
    for name in args.workloads.split(","):
        results["workloads"][name] = measure(WORKLOADS[name], args.samples, variants, args.quick, args.seed,
                                             earlier.get("workloads", {}).get(name), readout_zero_init)
    results["load_end"] = os.getloadavg()[0]
    report(results)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    plot(results, args.out / f"{stem}.png")
    print(f"\nwrote {args.out / f'{stem}.json'} and {args.out / f'{stem}.png'}")


if __name__ == "__main__":
    main()
