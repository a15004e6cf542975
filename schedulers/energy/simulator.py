"""Trace-driven simulation of a recurring job under a batch-size policy and JIT power limits.

A run of batch size b draws one of the seeded training paths of b from ``summary_train.csv``
(epochs to reach the target; a path that never reaches it runs ``max_epochs`` and fails). Time and
average power per epoch at (b, power limit) come from the GPU's power trace. The power limit of b is
the cost-minimal one found by JIT profiling (:class:`PowerLimitOptimizer`) on the first run of b.
Profiling is accounted for: on that first run, ``profile_steps`` steps run at every candidate limit
(highest to lowest) before the rest of the run continues at the chosen limit; these steps are useful
training work, so only the difference in time and power is charged. A run whose cost passes the
bandit's bound β·(min cost) is stopped there (cost = bound, not converged). Each recurrence is one
run: a run that fails is paid for and not retried. The default (b0 at the maximum limit) and the
oracle (best fixed batch size at its JIT limit, no profiling) are expected costs over the seeded paths.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

import numpy as np

from schedulers.energy.batch_size import BatchSizeBandit
from schedulers.energy.power_limit import PowerLimitOptimizer, energy_cost
from schedulers.energy.traces import WORKLOADS, Workload, ZeusTraces

Policy = Callable[[list[int], int, int, float], BatchSizeBandit]

POLICIES: dict[str, Policy] = {
    "hydro": lambda sizes, default, seed, beta: BatchSizeBandit(sizes, default, seed=seed, beta=beta),
    "zeus": lambda sizes, default, seed, beta: BatchSizeBandit.zeus(sizes, default, seed=seed, beta=beta),
}


@dataclass(frozen=True)
class Recurrence:
    """One recurrence: chosen batch size and power limit (W), energy (J), time (s), cost (J)."""

    batch_size: int
    power_limit_w: int
    energy_j: float
    time_s: float
    cost: float
    converged: bool
    profiled: bool


@dataclass
class SimulationResult:
    """A policy on one workload, GPU and seed; ``default_cost``/``oracle_cost`` are expected totals (J)."""

    workload: str
    gpu: str
    policy: str
    seed: int
    recurrences: list[Recurrence]
    default_cost: float
    default_energy_j: float
    default_time_s: float
    oracle_cost: float
    oracle_batch_size: int
    totals: dict[str, float] = field(init=False)

    def __post_init__(self) -> None:
        energy = sum(r.energy_j for r in self.recurrences)
        time = sum(r.time_s for r in self.recurrences)
        cost = sum(r.cost for r in self.recurrences)
        self.totals = {
            "energy_j": energy,
            "time_s": time,
            "cost": cost,
            "energy_savings": 1.0 - energy / self.default_energy_j,
            "time_savings": 1.0 - time / self.default_time_s,
            "cost_savings": 1.0 - cost / self.default_cost,
            "regret": cost - self.oracle_cost,
            "regret_fraction": cost / self.oracle_cost - 1.0,
        }

    def to_dict(self) -> dict:
        return asdict(self)


class JobSimulator:
    """Recurring runs of ``workload`` on ``traces`` (one GPU) with η and β of the Zeus cost."""

    def __init__(
        self,
        traces: ZeusTraces,
        workload: Workload,
        *,
        eta: float = 0.5,
        beta: float = 2.0,
        profile_steps: int = 50,
    ) -> None:
        self.traces = traces
        self.workload = workload
        self.eta = eta
        self.beta = beta
        self.profile_steps = profile_steps
        self.batch_sizes = traces.batch_sizes(workload)
        self.default_batch_size = traces.default_batch_size(workload)
        self.max_power_w = traces.max_power_w(workload)
        self._power = {b: traces.power(workload, b) for b in self.batch_sizes}
        self._paths = {b: traces.epochs_to_target(workload, b) for b in self.batch_sizes}
        self.power_limit = {b: self._jit_limit(b) for b in self.batch_sizes}

    def _jit_limit(self, b: int) -> int:
        """Cost-minimal limit (W) of b from one window per limit; windows hold the same work (one epoch)."""
        opt = PowerLimitOptimizer(self._power[b], eta=self.eta, max_power_w=self.max_power_w)
        for limit, p in self._power[b].items():
            opt.observe(limit, p.time_per_epoch_s, p.time_per_epoch_s * p.average_power_w)
        return opt.best()

    def _run(self, b: int, limit: int, epochs: float, profile: bool) -> tuple[float, float]:
        """Energy (J) and time (s) of ``epochs`` epochs of b at ``limit``, with JIT profiling if asked."""
        at = self._power[b][limit]
        energy = epochs * at.time_per_epoch_s * at.average_power_w
        time = epochs * at.time_per_epoch_s
        if profile:
            window = self.profile_steps / math.ceil(self.workload.train_samples / b)  # epochs per window
            left = epochs
            for limit_w in sorted(self._power[b], reverse=True):  # JIT order: highest limit first
                p = self._power[b][limit_w]
                span = min(window, left)
                left -= span
                energy += span * (p.time_per_epoch_s * p.average_power_w - at.time_per_epoch_s * at.average_power_w)
                time += span * (p.time_per_epoch_s - at.time_per_epoch_s)
        return energy, time

    def expected(self, b: int, limit: int) -> tuple[float, float, float]:
        """Expected (cost J, energy J, time s) of one unbounded run of b at ``limit``, no profiling."""
        runs = [self._run(b, limit, e if math.isfinite(e) else self.workload.max_epochs, False) for e in self._paths[b]]
        energy = float(np.mean([r[0] for r in runs]))
        time = float(np.mean([r[1] for r in runs]))
        return energy_cost(energy, time, self.eta, self.max_power_w), energy, time

    def oracle(self) -> tuple[int, float]:
        """Best fixed arm: (batch size, expected cost per run in J) at its JIT power limit."""
        costs = {b: self.expected(b, self.power_limit[b])[0] for b in self.batch_sizes}
        best = min(costs, key=costs.__getitem__)
        return best, costs[best]

    def simulate(self, policy: str, seed: int, recurrences: int = 50) -> SimulationResult:
        """Run ``recurrences`` recurrences choosing batch sizes with ``policy`` (a key of POLICIES)."""
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose one of {sorted(POLICIES)}.")
        bandit = POLICIES[policy](self.batch_sizes, self.default_batch_size, seed, self.beta)
        rng = np.random.default_rng([seed, 1])
        profiled: set[int] = set()
        records = []
        for _ in range(recurrences):
            b = bandit.choose()
            limit = self.power_limit[b]
            epochs = float(rng.choice(self._paths[b]))
            converged = math.isfinite(epochs)
            energy, time = self._run(b, limit, epochs if converged else self.workload.max_epochs, b not in profiled)
            cost = energy_cost(energy, time, self.eta, self.max_power_w)
            bound = bandit.stop_cost
            if bound is not None and cost > bound:
                energy, time, cost, converged = energy * bound / cost, time * bound / cost, bound, False
            records.append(Recurrence(b, limit, energy, time, cost, converged, b not in profiled))
            profiled.add(b)
            bandit.observe(b, cost, converged)
        max_limit = int(self.max_power_w)
        default_cost, default_energy, default_time = self.expected(self.default_batch_size, max_limit)
        oracle_b, oracle_cost = self.oracle()
        return SimulationResult(
            workload=self.workload.dataset,
            gpu=self.traces.gpu,
            policy=policy,
            seed=seed,
            recurrences=records,
            default_cost=recurrences * default_cost,
            default_energy_j=recurrences * default_energy,
            default_time_s=recurrences * default_time,
            oracle_cost=recurrences * oracle_cost,
            oracle_batch_size=oracle_b,
        )


def simulate_grid(
    gpus: Iterable[str],
    workloads: Iterable[str],
    policies: Iterable[str],
    seeds: Iterable[int],
    *,
    recurrences: int = 50,
    eta: float = 0.5,
    beta: float = 2.0,
    traces_path: str | None = None,
) -> list[SimulationResult]:
    """Every (gpu, workload, policy, seed) combination; workloads are keys of ``WORKLOADS``."""
    unknown = set(workloads) - set(WORKLOADS)
    if unknown:
        raise ValueError(f"unknown workloads {sorted(unknown)}; choose from {sorted(WORKLOADS)}.")
    results = []
    for gpu in gpus:
        traces = ZeusTraces(gpu, traces_path)
        for name in workloads:
            sim = JobSimulator(traces, WORKLOADS[name], eta=eta, beta=beta)
            results += [sim.simulate(p, s, recurrences) for p in policies for s in seeds]
    return results
