"""Rung halving against full rungs, paired: does halving return another configuration, and how much worse is it?

Per workload of ``benchmarks/transfer_fidelity.py`` and seed, the configurations are drawn as that benchmark draws
them and each pair of variants (the default policy at S=8 and ``scale="auto"``, each with full rungs and with rung
halving: in every rung, or, as ``TransferPolicy``'s default ``halving="auto"``, where the search's own curves show
its milestones' ranking agree with the end's) runs as that benchmark runs it (``hydro_run``: search, rungs,
targets, escalation and fallback targets; the full-size targets shared; a variant in two pairs runs once). Where the two return different configurations, both train as Hydro's full-size
target over the benchmark's seeds and the difference of their means is the halving's loss ("expected", in points
or % of the loss; positive: halving returned the worse one). Without stock's trainings this is the cheap half of
the fidelity benchmark: where the two agree, halving's fidelity is the full rungs'. Also each variant's planned
cost (``TransferPolicy.cost``, full-size trainings) and what it trained (the search included), CPU seconds and,
for ``halving="auto"``, what it chose: the search members' Spearman at each milestone and its 95% lower bound.
In this process, one torch thread. Prints a table; writes ``halving_fidelity.json`` to ``--out``.

    python -m benchmarks.halving_fidelity [--workloads mlp,resmlp,cnn] [--seeds 0-9] [--samples 16]
                                          [--pairs "S=8 default,auto,S=8 default+halving-auto,auto+halving-auto"]
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from benchmarks.transfer_fidelity import NOISE_SEEDS, VARIANTS, WORKLOADS, Trainer, hydro_run, shortfall
from hydro.trial.scale_plan import measured_scale
from hydro.tune.search.random_search import RandomSearch
from schedulers.scale_choice import AUTO
from schedulers.transfer import Score, TransferPolicy

FULL = "S=8 ladder+escalate-probe+fallback-2"
PAIRS = {"S=8 default": (FULL, f"{FULL}+halving"),
         "auto": ("auto", "auto+halving"),
         "S=8 default+halving-auto": (FULL, f"{FULL}+halving-auto"),
         "auto+halving-auto": ("auto", "auto+halving-auto")}


def paired(workload: str, seed: int, samples: int, pairs: list[str]) -> dict:
    """Each of ``pairs`` (names of :data:`PAIRS`) on ``samples`` configurations of ``workload`` drawn with
    ``seed``."""
    spec, space = WORKLOADS[workload].make(False)
    drawn = RandomSearch(space, seed=seed)
    configs = {f"c{i:02d}": drawn.suggest(str(i)) for i in range(samples)}
    trainer = Trainer(spec, spec.load_data())
    targets: dict[str, tuple[float, float]] = {}
    expected: dict[str, Score] = {}
    result = {"workload": workload, "seed": seed, "epochs": spec.epochs, "pairs": {}}
    scale = None  # auto's, measured once per workload and seed
    done: dict[str, dict] = {}  # variant -> its run: deterministic, so one run serves every pair it is in
    for pair in pairs:
        names = PAIRS[pair]
        for name in (n for n in names if n not in done):
            options = VARIANTS[name]
            if options["scale"] == AUTO:
                scale = scale or measured_scale(spec, configs["c00"], trainer.data, samples, threads=1).scale
                options = {**options, "scale": scale}
            policy = TransferPolicy(1.0, samples, spec.metric, spec.mode, epochs=spec.epochs, **options)
            before = trainer.seconds
            run = hydro_run(trainer, configs, policy, targets)
            done[name] = {"scale": policy.scale, "returned": run["returned"], "target": run["target"],
                          "plan_cost": run["plan_cost"], "trained_cost": run["trained_cost"],
                          "cpu_s": trainer.seconds - before, "escalated": bool(run["escalation"]),
                          "fallback": run["fallback"], "halving_choice": run["halving_choice"]}
        runs = {name: done[name] for name in names}
        full, halved = (runs[n]["returned"] for n in names)
        loss = None
        if full != halved:
            for c in (full, halved):
                if c not in expected:
                    first = targets[c][0] if c in targets else trainer.target(configs[c], mup=True)
                    expected[c] = Score.of([first] + [trainer.target(configs[c], mup=True, seed=s) for s in NOISE_SEEDS])
            loss = shortfall(spec, expected[halved].mean, expected[full].mean)
        result["pairs"][pair] = {"runs": runs, "loss": loss,
                                 "expected": {c: vars(expected[c]) for c in (full, halved) if c in expected}}
    return result


def chosen(run: dict) -> str:
    """How a halving variant's run halved: ``every rung``, or ``halving="auto"``'s choice with the search members'
    Spearman at each milestone checked (its 95% lower bound in brackets)."""
    choice = run["halving_choice"]
    if choice is None:
        return "every rung"
    agreements = ", ".join(f"epoch {a['epoch']}: {a['rho']:.2f} ({a['lower']:.2f})" for a in choice["agreements"])
    return f"auto: {'on' if choice['halving'] else 'off'}" + (f", {agreements}" if agreements else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="mlp,resmlp,cnn")
    parser.add_argument("--seeds", default="0-9", help="a range FIRST-LAST")
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated subset of {list(PAIRS)}")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    pairs = args.pairs.split(",")
    if unknown := [p for p in pairs if p not in PAIRS]:
        parser.error(f"unknown pairs {unknown}; choose from {list(PAIRS)}")
    first, last = map(int, args.seeds.split("-"))
    torch.set_num_threads(1)
    load = [os.getloadavg()[0]]
    rows = []
    for seed in range(first, last + 1):
        for workload in args.workloads.split(","):
            rows.append(paired(workload, seed, args.samples, pairs))
            args.out.mkdir(parents=True, exist_ok=True)  # written as it goes: a long run keeps what it measured
            (args.out / "halving_fidelity.json").write_text(json.dumps({"load": load, "rows": rows}, indent=1))
    load.append(os.getloadavg()[0])
    print("| workload, seed | pair | halving (milestone Spearman, lower bound) | returned full / halving | "
          "loss (points) | planned cost full / halving | trained cost full / halving | CPU s full / halving |\n"
          "|---|---|---|---|---|---|---|---|")
    for r in rows:
        for pair, p in r["pairs"].items():
            full, halved = p["runs"].values()
            loss = "same" if p["loss"] is None else f"{100 * p['loss']:+.2f}"
            print(f"| {r['workload']}, {r['seed']} | {pair} (S={full['scale']}) | {chosen(halved)} | "
                  f"{full['returned']} / "
                  f"{halved['returned']} | {loss} | {full['plan_cost']:.2f} / {halved['plan_cost']:.2f} | "
                  f"{full['trained_cost']:.2f} / {halved['trained_cost']:.2f} | {full['cpu_s']:.0f} / "
                  f"{halved['cpu_s']:.0f} |")
    (args.out / "halving_fidelity.json").write_text(json.dumps({"load": load, "rows": rows}, indent=1))
    print(f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; wrote {args.out / 'halving_fidelity.json'}")


if __name__ == "__main__":
    main()
