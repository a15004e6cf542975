"""The pilot of ``scale="auto"``: how often it moves a search from S=8 to S=4, per workload and seed.

Per workload of ``benchmarks/transfer_fidelity.py`` and seed, the configurations are drawn as that benchmark draws
them (seeded random search) and :func:`hydro.trial.scale_plan.piloted_scale` checks a choice of S=8 (as if the
step times had chosen it) on the first ``Pilot.configs`` of them: their Spearman rho at S=8 against S=4 after the
pilot's epochs, and whether it moves the search to S=4. Read against each workload's full-size ranking at S=8
(``benchmarks/recorded/05-transfer-fidelity-spearman-per-scale.json``): a pilot should move the workloads S=8 ranks
badly and keep the others. In this process, one torch thread; CPU time. Prints a table; writes
``scale_pilot.json`` to ``--out``.

    python -m benchmarks.scale_pilot [--workloads resmlp,resmlp-wide] [--seeds 0-9] [--samples 16]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import torch

from benchmarks.transfer_fidelity import WORKLOADS
from hydro.trial.scale_plan import piloted_scale
from hydro.tune.search.random_search import RandomSearch
from schedulers.scale_choice import PILOT_CONFIGS, PILOT_EPOCH_SHARE, Pilot, ScaleChoice

COARSE = 8


def pilot_once(workload: str, seed: int, samples: int, configs: int, epoch_share: int) -> dict:
    """The pilot (of ``configs`` configurations, ``1/epoch_share`` of the epochs) of a search at S=8 of ``samples``
    configurations of ``workload`` drawn with ``seed``."""
    spec, space = WORKLOADS[workload].make(False)
    drawn = RandomSearch(space, seed=seed)
    drawn_configs = [drawn.suggest(str(i)) for i in range(samples)]
    start = time.process_time()
    choice = piloted_scale(spec, ScaleChoice(COARSE, {}), drawn_configs, spec.load_data(), samples, threads=1,
                           device=torch.device("cpu"), pilot_configs=configs, epoch_share=epoch_share)
    pilot = Pilot.plan(COARSE, samples, spec.epochs, configs, epoch_share)
    return {"workload": workload, "seed": seed, "scale": choice.scale, "reason": choice.reason,
            "seconds": time.process_time() - start, "cost": pilot.cost(), "epochs": f"{pilot.epochs}/{spec.epochs}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default="resmlp,resmlp-wide")
    parser.add_argument("--seeds", default="0-9", help="a range FIRST-LAST")
    parser.add_argument("--samples", type=int, default=16, help="the search's configurations")
    parser.add_argument("--configs", type=int, default=PILOT_CONFIGS, help="the pilot's configurations")
    parser.add_argument("--epoch-share", type=int, default=PILOT_EPOCH_SHARE,
                        help="the pilot trains 1/this of the epochs")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    first, last = map(int, args.seeds.split("-"))
    torch.set_num_threads(1)
    logging.basicConfig(level=logging.WARNING)
    load = [os.getloadavg()[0]]
    options = {"configs": args.configs, "epoch_share": args.epoch_share}
    rows = [pilot_once(w, seed, args.samples, **options) for w in args.workloads.split(",") for seed in range(first, last + 1)]
    load.append(os.getloadavg()[0])
    print("| workload | seed | pilot epochs | cost (full-size trainings) | CPU s | scale | pilot |\n|---" * 1 + "|---" * 6 + "|")
    for r in rows:
        print(f"| {r['workload']} | {r['seed']} | {r['epochs']} | {r['cost']:.2f} | {r['seconds']:.1f} | "
              f"S={r['scale']} | {r['reason'].split('; ')[-1]} |")
    for w in args.workloads.split(","):
        mine = [r for r in rows if r["workload"] == w]
        print(f"{w}: moved to S={COARSE // 2} on {sum(r['scale'] != COARSE for r in mine)} of {len(mine)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "scale_pilot.json").write_text(json.dumps({"load": load, "options": options, "rows": rows}, indent=1))
    print(f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end; wrote {args.out / 'scale_pilot.json'}")


if __name__ == "__main__":
    main()
