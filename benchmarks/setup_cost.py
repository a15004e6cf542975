"""Set-up cost of a surrogate trial: building the fused µP members of one trial against building one full-size model.

The workload is ``e2e_tuning --workload cifar-resnet``'s (the CIFAR ResNet-18 of ``hydro.examples.models``, SGD).
In one process, interleaved round by round (so machine load hits every variant alike):
  full      one full-size ResNet-18 built by the workload's factory (the unit of the ratio);
  template  the fused members of one trial (``--members`` µP surrogates at ``--scale``) as ``FusedMembers`` builds
            them, from the process's shrunk template of that architecture and scale;
  plain     the same members built one by one (``build_member``: the seeded full-size model, shrunk; fused): what a
            template replaces and must equal bit for bit (checked here too).
The first template build of the process also makes (and checks) the template; it is reported apart ("cold").
Prints a table and writes ``benchmarks/results/setup_cost.json`` with the load average (``uptime``) before and after.

    python -m benchmarks.setup_cost [--members 32] [--scale 8] [--rounds 3] [--threads 1] [--no-plain]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import hydro
from benchmarks.e2e_tuning import cifar_resnet
from hydro.trial import members as members_module
from hydro.trial.members import FusedMembers

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--members", type=int, default=32)
    parser.add_argument("--scale", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial's CPUs)")
    parser.add_argument("--no-plain", action="store_true", help="skip the one-by-one build (slow)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    spec, _ = cifar_resnet(epochs=1)
    configs = [{"lr": 0.01 * (i + 1), "momentum": 0.9, "weight_decay": 0.0} for i in range(args.members)]
    ids = [str(i) for i in range(args.members)]
    load_before = os.getloadavg()

    def template() -> FusedMembers:
        return FusedMembers(spec, configs, ids, args.scale, mup=True)

    def plain() -> hydro.FusedModel:
        return hydro.fuse(members_module._build(spec, configs, ids, args.scale, True))

    cold, first = _timed(template)
    times: dict[str, list[float]] = {"full": [], "template": [], "plain": []}
    for _ in range(args.rounds):
        times["full"].append(_timed(lambda: spec.model(configs[0]))[0])
        times["template"].append(_timed(template)[0])
        if not args.no_plain:
            seconds, model = _timed(plain)
            times["plain"].append(seconds)
            _check_equal(first.model, model)
    full = statistics.median(times["full"])
    rows = [{"variant": "full-size ResNet-18 (one)", "seconds": full, "ratio": 1.0},
            {"variant": f"{args.members} members S={args.scale}, template (cold: makes it)", "seconds": cold,
             "ratio": cold / full},
            {"variant": f"{args.members} members S={args.scale}, template", "seconds": statistics.median(
                times["template"]), "ratio": statistics.median(times["template"]) / full}]
    if times["plain"]:
        rows.append({"variant": f"{args.members} members S={args.scale}, one by one",
                     "seconds": statistics.median(times["plain"]), "ratio": statistics.median(times["plain"]) / full})
    report("setup_cost", f"set-up cost, {args.rounds} interleaved rounds (medians), {args.threads} torch thread(s)",
           [("variant", "variant", "<52"), ("seconds", "seconds", "8.3f"), ("ratio", "x full", "8.1f")], rows,
           {"args": vars(args), "times": times}, load_before)
    return 0


def report(name: str, title: str, columns: list[tuple[str, str, str]], rows: list[dict], record: dict,
           load_before: tuple[float, float, float]) -> Path:
    """Print ``title`` with the CPU count and the load average (``load_before`` and now), then ``rows`` as a table of
    ``columns`` (key, header, format spec), and write them with ``record``, torch's and Python's versions and the
    machine as ``benchmarks/results/<name>.json``; returns its path."""
    load_after = os.getloadavg()
    print(f"\n{title}, {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before / {load_after[0]:.1f} after\n")
    widths = [spec.lstrip("<>").split(".")[0] for _, _, spec in columns]
    print(" ".join(f"{header:{'<' if spec.startswith('<') else '>'}{width}}"
                   for (_, header, spec), width in zip(columns, widths)))
    for row in rows:
        print(" ".join(f"{row[key]:{spec}}" for key, _, spec in columns))
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.json"
    out.write_text(json.dumps({**record, "rows": rows, "load_before": load_before, "load_after": load_after,
                               "torch": torch.__version__, "python": sys.version.split()[0],
                               "machine": platform.machine(), "cpus": os.cpu_count()}, indent=2))
    print(f"\nwritten: {out}")
    return out


def _timed(build):
    start = time.perf_counter()
    result = build()
    return time.perf_counter() - start, result


def _check_equal(fused: hydro.FusedModel, plain: hydro.FusedModel) -> None:
    want, got = plain.state_dict(), fused.state_dict()
    if list(want) != list(got) or not all(torch.equal(got[k], v) for k, v in want.items()):
        raise AssertionError("setup_cost: members from the template differ from members built one by one")


if __name__ == "__main__":
    sys.exit(main())
