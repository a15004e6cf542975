"""``hydro demo``: fused training of many learning-rate/momentum configurations of an MLP on digits.

The configurations are trained in fused groups whose size ``plan_fusion`` picks from measurements on
this machine; every member reports its own validation accuracy, as if it had been trained alone.
"""
from __future__ import annotations

import argparse
import functools
import math
import random
import time

import torch
from torch import nn

from hydro.binder import fuse
from hydro.examples.data import digits
from hydro.examples.models import MLP
from hydro.loss import trial_losses
from hydro.optim import SGD
from hydro.fusion_measure import plan_fusion


def add_subparser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("demo", help="fused training of many MLP configurations on digits (no Ray, a few "
                                         "seconds)", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--configs", type=int, default=16, help="number of random configurations")
    parser.add_argument("--epochs", type=int, default=4, help="training epochs of every configuration")
    parser.add_argument("--width", type=int, default=64, help="hidden width of the MLP (64 -> width -> 10)")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch size")
    parser.add_argument("--fusion", default="auto", help="members per fused model, or 'auto' (measured)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the configurations and the data split")
    parser.set_defaults(func=run)


def sample_configs(count: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"lr": 10 ** rng.uniform(-3, 0), "momentum": rng.choice([0.0, 0.5, 0.9])} for _ in range(count)]


def run(args: argparse.Namespace) -> int:
    torch.manual_seed(args.seed)
    train, val = digits(seed=args.seed)
    loss_fn = nn.CrossEntropyLoss()
    configs = sample_configs(args.configs, args.seed)
    make_model = functools.partial(MLP, (train.x.shape[1], args.width, 10))
    if args.fusion == "auto":
        plan = plan_fusion(make_model, (train.x[: args.batch_size], train.y[: args.batch_size]), loss_fn,
                           max_members=len(configs))
        fusion = plan.num_members
        print(f"plan_fusion: F={fusion} ({plan.reason}); measured member-samples/s: "
              + ", ".join(f"F={m.num_members}: {m.samples_per_s:,.0f}" for m in plan.measurements))
    else:
        fusion = int(args.fusion)
    start = time.perf_counter()
    results = []
    for first in range(0, len(configs), fusion):
        group = configs[first: first + fusion]
        accuracy = train_group(make_model, group, train, val, loss_fn, args.epochs, args.batch_size)
        results += [{**cfg, "val_acc": acc} for cfg, acc in zip(group, accuracy)]
    elapsed = time.perf_counter() - start
    print(f"\n{len(configs)} configurations, {math.ceil(len(configs) / fusion)} fused groups of up to {fusion}, "
          f"{args.epochs} epochs each: {elapsed:.1f} s")
    print(f"{'lr':>9} {'momentum':>9} {'val_acc':>8}")
    for r in sorted(results, key=lambda r: -r["val_acc"])[:10]:
        print(f"{r['lr']:9.4f} {r['momentum']:9.1f} {r['val_acc']:8.4f}")
    best = max(results, key=lambda r: r["val_acc"])
    print(f"best: lr={best['lr']:.4f} momentum={best['momentum']} val_acc={best['val_acc']:.4f}")
    return 0


def train_group(make_model, group: list[dict], train, val, loss_fn, epochs: int, batch_size: int) -> list[float]:
    """Train one fused model of ``len(group)`` members (each ``make_model()``); returns each member's
    validation accuracy."""
    model = fuse([make_model() for _ in group])
    optimizer = SGD(model.parameters(), lr=[c["lr"] for c in group], momentum=[c["momentum"] for c in group])
    for _ in range(epochs):
        model.train()
        for index in torch.randperm(len(train.y)).split(batch_size):
            optimizer.zero_grad()
            trial_losses(loss_fn, model(train.x[index]), train.y[index]).sum().backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        predictions = model(val.x).argmax(dim=-1)  # [F, N]
    return (predictions == val.y).float().mean(dim=1).tolist()



