"""A pipeline-parallel job whose stages are Ray actors, each able to host a fill trial in its bubbles.

Each stage actor joins a NCCL process group when it has a GPU (``num_gpus_per_stage``), gloo otherwise, runs
1F1B iterations (:class:`~hydro.pipeline.stage.PipelineStage`) on its device and reports its operations and
bubbles. ``attach_fill`` co-locates a Hydro fused trial with the stage, in a process of its own on the stage's
core (:class:`~hydro.bubbles.fill_process.FillProcess`): ``SlotMode.GATED`` runs it only inside bubbles, layer
by layer, under ``SCHED_IDLE``; ``SlotMode.NAIVE`` lets it run alongside at normal priority (for contrast).
The fill is untrusted: an iteration never waits for it, and a fill that raises, crashes or hangs is detached.
Stage actors are named ``hydro-bubbles/<job>/<stage>`` so a placement policy can find them. The stages rendezvous
on the address of the node Ray placed stage 0 on (loopback when all share one node), so a job spans nodes.
Registered with energy on (:class:`~hydro.tune.pipeline.stage_energy.StageEnergy`), a stage either stays a bubble
slot or follows a Perseus clock plan on its device, whichever its measured slack is worth more to.
"""
from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict

import ray
import torch
from ray import cloudpickle

from hydro.bubbles.host import DedicatedHost, GatedHost, SlotMode
from hydro.pipeline.schedule import one_f_one_b
from hydro.pipeline.stage import PipelineSpec, PipelineStage
from hydro.energy.device import EnergyDevice
from hydro.pipeline.profiler import blocking_power_w, profile_stage, reference_instructions
from hydro.trial.plan import TrialPlan
from hydro.trial.spec import TuneSpec
from hydro.tune.pipeline import stage_energy
from hydro.tune.pipeline.stage_energy import FillRate, MeasuredStages, StageEnergy
from schedulers.pipeline_energy import ProfileRow, SlackUse, StageDecision


# A Ray worker's __main__ (the script multiprocessing runs again in each fill process) imports Ray, and a Hydro
# workload's param space is written with Ray Tune: the hosts' fill servers import both once, so fills start
# without importing them again.
FILL_PRELOAD = ("ray", "ray.tune")
BLOCKING_PROBE_S = 0.05  # how long a stage idles to measure its device's blocking power


class StageHost(GatedHost):
    """The body of a stage actor (plain class; Ray wraps it in :func:`stage_actor`)."""

    def __init__(self, spec: PipelineSpec, stage: int, num_stages: int, fill_memory_bytes: int | None,
                 timeouts: dict | None = None):
        torch.set_num_threads(1)
        cores = sorted(os.sched_getaffinity(0))
        super().__init__(f"stage {stage}", {cores[stage % len(cores)]}, fill_memory_bytes, timeouts,  # shares the core
                         preload=FILL_PRELOAD)
        self.spec, self.rank, self.num_stages = spec, stage, num_stages
        self.stage: PipelineStage | None = None  # once connected
        self.energy_device: EnergyDevice | None = None  # where this stage's clocks change (see profile_clocks)
        self.clock_plan: list[int] | None = None  # MHz per instruction its iterations follow (see follow_clocks)

    def node(self) -> tuple[str, int]:
        """This stage's node address (Ray's) and a free port on it (for the rendezvous of stage 0)."""
        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def connect(self, address: str) -> None:
        """Join the job's process group at ``address`` (see :func:`rendezvous`) and build the stage. Gloo talks over
        the interface that carries this node's address (loopback for a single-node job) unless
        ``GLOO_SOCKET_IFNAME`` is set."""
        host = address.removeprefix("tcp://").rpartition(":")[0]
        interface = "lo" if host == LOOPBACK else interface_of(ray.util.get_node_ip_address())
        if interface is not None:
            os.environ.setdefault("GLOO_SOCKET_IFNAME", interface)
        device = stage_device()
        torch.distributed.init_process_group(process_group_backend(device), init_method=address, rank=self.rank,
                                             world_size=self.num_stages)
        self.stage = PipelineStage(self.spec, self.rank, self.num_stages, self.recorder, device)

    def profile(self, iterations: int) -> tuple[float, float]:
        return self.stage.profile(iterations)

    def run(self, iterations: int, fill_activity: bool = False) -> dict:
        """Run ``iterations``; returns the stage's losses, operations and bubbles (wall-clock seconds; ``bubbles`` as
        the fill's gate saw them, ``device_bubbles`` as the stage's device did), and the
        hosted fill trial's work meanwhile (its units' times too with ``fill_activity``). The iterations never
        wait for the fill; a fill found dead or hung afterwards is detached."""
        os.sched_setaffinity(0, self.cpus)
        self.stage.timeline.clear()
        self.stage.device_bubbles.clear()
        self.recorder.bubbles.clear()
        fill = self.fill
        fill_steps, fill_compute = (fill.completed_steps, fill.compute_s) if fill is not None else (0, 0.0)
        started = time.time()
        losses = []
        with self._clocks():
            for _ in range(iterations):
                losses.append(self.stage.run_iteration())
                self.check_fill()
        report = {"stage": self.stage.stage, "losses": losses, "wall_s": time.time() - started,
                  "ops": [asdict(i) for i in self.stage.timeline],
                  "bubbles": [{**asdict(b), "length": b.length} for b in self.recorder.bubbles],
                  "device_bubbles": [asdict(b) for b in self.stage.device_bubbles]}
        if fill is not None and fill is self.fill:  # the same fill trial throughout: its work in this run
            report["fill_steps"] = fill.completed_steps - fill_steps
            report["fill_compute_s"] = fill.compute_s - fill_compute
            report["fill_members"] = len(fill.member_ids)
            if fill_activity:
                with self.fill_lock:
                    report["fill_activity"] = [a for a in fill.activity() if a[0] >= started]
        return report

    def _clocks(self):
        """The clock plan this stage follows (restored to the default clock after), or nothing."""
        if self.clock_plan is None:
            return contextlib.nullcontext()
        return self.stage.planned_clocks(self.clock_plan, self.energy_device)

    def profile_clocks(self, device: Callable[[int], EnergyDevice], repeats: int = 3) -> tuple[list[ProfileRow], float]:
        """Perseus's rows of this stage's forward and backward (one microbatch of the reference pipeline) on the
        device ``device(stage)`` makes here (kept for :meth:`follow_clocks`), and its power (W) while it blocks."""
        os.sched_setaffinity(0, self.cpus)
        self.energy_device = device(self.rank)
        runs = reference_instructions(self.spec, self.rank, self.num_stages, self.stage.device)
        rows = profile_stage(self.rank, runs, self.energy_device, repeats=repeats)
        return rows, blocking_power_w(self.energy_device, lambda: (time.sleep(BLOCKING_PROBE_S), BLOCKING_PROBE_S)[1])

    def follow_clocks(self, frequencies: list[int] | None) -> None:
        """From the next :meth:`run` on, run every iteration at ``frequencies`` (MHz per instruction, schedule order;
        ``None``: the default clock) on the device of :meth:`profile_clocks`."""
        if frequencies is not None and self.energy_device is None:
            raise RuntimeError(f"pipeline_job: stage {self.rank} has no energy device; profile_clocks first.")
        self.clock_plan = None if frequencies is None else list(frequencies)

    def clock_history(self) -> list[int | str]:
        """The clocks set on this stage's energy device (MHz, or ``"reset"``), as far as the device records them."""
        return list(getattr(self.energy_device, "clock_history", []))

    def iteration(self) -> int:
        """Iterations this stage has run."""
        return self.stage.iteration

    def weights(self) -> dict:
        return {k: v.clone() for k, v in self.stage.model.state_dict().items()}

    def shutdown(self) -> dict | None:
        """End the stage: stop any fill trial (returning what :meth:`detach_fill` returns) and leave the process
        group."""
        checkpoint = self.detach_fill()
        torch.distributed.destroy_process_group()
        return checkpoint

    def run_frequency_plan(self, iterations: int, frequencies: list[int], device: EnergyDevice) -> dict:
        """Run ``iterations`` with ``frequencies`` (MHz per instruction of this stage, schedule order) on
        ``device``; returns the losses, wall time, the device's energy (J) and its clock afterwards."""
        os.sched_setaffinity(0, self.cpus)
        energy, started = device.energy_j(), time.time()
        losses = self.stage.run_frequency_plan(iterations, frequencies, device)
        return {"stage": self.stage.stage, "losses": losses, "wall_s": time.time() - started,
                "energy_j": device.energy_j() - energy, "frequency_after_mhz": device.get_frequency_mhz()}


LOOPBACK = "127.0.0.1"


def rendezvous(nodes: list[tuple[str, int]]) -> str:
    """The process group's address from every stage's ``(node address, free port)``: stage 0's node and port, or
    loopback when all stages share one node."""
    address, port = nodes[0]
    return f"tcp://{LOOPBACK if len({a for a, _ in nodes}) == 1 else address}:{port}"


def interface_of(address: str) -> str | None:
    """The name of this machine's network interface with IPv4 ``address`` (Linux), ``None`` if none has it."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                request = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:  # no IPv4 address
                continue
            if socket.inet_ntoa(request[20:24]) == address:
                return name
    return None


def stage_device() -> torch.device:
    """This stage's device: the first GPU Ray gave the actor, else the CPU."""
    gpus = ray.get_gpu_ids()
    return torch.device("cuda", 0) if gpus and torch.cuda.is_available() else torch.device("cpu")


def process_group_backend(device: torch.device) -> str:
    """NCCL between GPU stages, gloo between CPU stages."""
    return "nccl" if device.type == "cuda" else "gloo"


def stage_actor(num_cpus: float = 1, num_gpus: float = 0):
    """The Ray actor class of a stage (threaded, so fill control calls run while an iteration runs)."""
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_concurrency=4)(StageHost)


class PipelineJob:
    """Driver of a pipeline job of ``num_stages`` Ray actors on the current Ray cluster."""

    def __init__(self, spec: PipelineSpec, num_stages: int = 2, name: str = "main",
                 fill_memory_bytes: int | None = None, num_cpus_per_stage: float = 1, num_gpus_per_stage: float = 0,
                 timeouts: dict | None = None) -> None:
        if 0 < num_gpus_per_stage < 1 and num_stages > 1:
            raise ValueError(
                f"pipeline_job: num_gpus_per_stage={num_gpus_per_stage} lets Ray put two stages on one GPU, and NCCL "
                f"cannot connect two ranks on one device (NCCL 2.28 on an H200: 'invalid usage'); give each stage a "
                f"whole GPU (num_gpus_per_stage=1) or run the stages on CPUs with gloo (num_gpus_per_stage=0)")
        self.spec, self.num_stages, self.name = spec, num_stages, name
        actor = stage_actor(num_cpus_per_stage, num_gpus_per_stage)
        self.actor_names = [f"hydro-bubbles/{name}/{s}" for s in range(num_stages)]
        self.stages = [actor.options(name=n).remote(spec, s, num_stages, fill_memory_bytes, timeouts)
                       for s, n in enumerate(self.actor_names)]
        address = rendezvous(ray.get([s.node.remote() for s in self.stages]))  # the nodes Ray placed them on
        ray.get([s.connect.remote(address) for s in self.stages])
        self.service = None

    def register(self, service, iterations: int = 3, energy: StageEnergy | None = None,
                 measured: MeasuredStages | None = None) -> list[StageDecision] | None:
        """Offer the stages to the placement ``service`` as bubble slots ``<job>/<stage>``: each stage's bubble
        fraction measured over ``iterations`` and the memory it can spare. With ``energy``, only the stages whose
        bubbles are worth more to fill trials than the clock plan's saving are offered; the others follow the plan's
        clocks from the next :meth:`run` on (see :mod:`hydro.tune.pipeline.stage_energy`); decided on ``measured``
        (default: :meth:`measure_stages` now); returns the decisions, which the service keeps with their reasons."""
        if energy is None:
            reports = self.run(iterations)
            fractions = [sum(b["length"] for b in r["bubbles"]) / r["wall_s"] for r in reports]
            budgets = ray.get([s.fill_budget.remote() for s in self.stages])
            ray.get(service.register_pipeline.remote(self.name, fractions, budgets, self.actor_names))
            self.service = service
            return None
        measured = measured if measured is not None else self.measure_stages(energy, iterations)
        decisions = stage_energy.decide(measured, self.spec.microbatches, energy)
        budgets = ray.get([s.fill_budget.remote() for s in self.stages])
        for d in decisions:
            if d.use is SlackUse.TRIALS:
                ray.get(service.register_stage.remote(self.name, d.stage, measured.bubble_fractions[d.stage],
                                                      budgets[d.stage], self.actor_names[d.stage]))
            else:
                ray.get(self.stages[d.stage].follow_clocks.remote(list(d.frequencies_mhz)))
        ray.get(service.record_decisions.remote(self.name, [stage_energy.record(d) for d in decisions]))
        self.service = service
        return decisions

    def measure_stages(self, energy: StageEnergy, iterations: int = 3) -> MeasuredStages:
        """Each stage's bubbles over ``iterations`` and its clocks' profile on ``energy.device(stage)`` (what
        :meth:`register` decides on)."""
        reports = self.run(iterations)
        profiles = ray.get([s.profile_clocks.remote(energy.device, energy.repeats) for s in self.stages])
        return MeasuredStages(tuple(profiles),
                              tuple(sum(b["length"] for b in r["bubbles"]) / iterations for r in reports),
                              tuple(sum(b["length"] for b in r["bubbles"]) / r["wall_s"] for r in reports))

    def measure_fill(self, stage: int, spec: TuneSpec, plan: TrialPlan, iterations: int = 6, measured_runs: int = 3,
                     rounds: int = 400) -> FillRate:
        """What a fused trial of ``spec``'s ``plan`` makes of ``stage``'s bubbles: started there, measured over
        ``measured_runs`` runs of ``iterations`` once it has trained a step (its start-up left out; its members go
        on at every epoch's end, waiting for that decision as a tuning run's fills do), then detached.

        Raises:
            RuntimeError: the fill failed, or trained no step in ``rounds`` runs of ``iterations``.
        """
        members = self.attach_fill(stage, spec, plan)
        try:
            steps = compute_s = bubble_s = 0.0
            measured = 0
            for _ in range(rounds):
                report = self.run(iterations)[stage]
                if "fill_steps" not in report:
                    raise RuntimeError(f"pipeline_job: the measuring fill on stage {stage} failed: "
                                       f"{self.fill_status(stage)}")
                status = self.fill_status(stage)
                if status is not None and status.get("result") is not None:  # an epoch ended: its members go on
                    ray.get(self.stages[stage].fill_decide.remote(members))
                if measured or report["fill_steps"] > 0:
                    measured += 1
                    if measured > 1:  # the run of its first step holds its start-up
                        steps += report["fill_steps"] * report["fill_members"]
                        compute_s += report["fill_compute_s"]
                        bubble_s += sum(b["length"] for b in report["bubbles"])
                    if measured > measured_runs:
                        return FillRate(steps / bubble_s, min(compute_s / bubble_s, 1.0))
            raise RuntimeError(f"pipeline_job: the measuring fill on stage {stage} trained no step in "
                               f"{rounds * iterations} iterations")
        finally:
            self.detach_fill(stage)

    def profile(self, iterations: int = 2) -> list[tuple[float, float]]:
        return ray.get([s.profile.remote(iterations) for s in self.stages])

    def run(self, iterations: int, fill_activity: bool = False) -> list[dict]:
        return ray.get([s.run.remote(iterations, fill_activity) for s in self.stages])

    def attach_fill(self, stage: int, spec: TuneSpec, plan: TrialPlan, mode: SlotMode = SlotMode.GATED,
                    member_ids: list[str] | None = None, state: dict | None = None) -> list[str]:
        """Start a fused trial of ``spec`` (its ``plan``'s ``member_ids``, as many as fit; or continued from
        ``state``) in ``stage``'s bubbles; returns the member ids it trains."""
        if member_ids is None and state is None:
            member_ids = [m for m, _ in plan.members]
        return ray.get(self.stages[stage].attach_fill.remote(pickled_workload(spec), plan, mode, member_ids=member_ids,
                                                             state=state))

    def fill_status(self, stage: int, wait_s: float = 0.0) -> dict | None:
        return ray.get(self.stages[stage].fill_status.remote(wait_s))

    def detach_fill(self, stage: int) -> dict | None:
        return ray.get(self.stages[stage].detach_fill.remote())

    def shutdown(self) -> list[dict | None]:
        """End the job; returns each stage's fill checkpoint (or ``None``) so fill trials continue elsewhere
        (and hands them to the placement service if the job is registered)."""
        if self.service is not None:
            ray.get(self.service.job_ending.remote(self.name))
        checkpoints = ray.get([s.shutdown.remote() for s in self.stages])
        if self.service is not None:
            slots = {f"{self.name}/{stage}": c for stage, c in enumerate(checkpoints)}
            ray.get(self.service.job_ended.remote(self.name, slots))
        for actor in self.stages:
            ray.kill(actor)
        return checkpoints

    def run_frequency_plan(self, iterations: int, stage_frequencies: list[list[int]],
                           devices: list[EnergyDevice]) -> list[dict]:
        """Run ``iterations`` with a Perseus plan: ``stage_frequencies[s]`` (MHz per instruction) applied on
        ``devices[s]`` by stage ``s``; every device's default clock is restored however the run ends."""
        if not len(stage_frequencies) == len(devices) == self.num_stages:
            raise ValueError(f"pipeline_job: {self.num_stages} stages need one frequency list and one device each; "
                             f"got {len(stage_frequencies)} and {len(devices)}.")
        lengths = [len(ops) for ops in one_f_one_b(self.num_stages, self.spec.microbatches)]
        if [len(f) for f in stage_frequencies] != lengths:  # checked here: one stage refusing would hang the others
            raise ValueError(f"pipeline_job: the stages run {lengths} instructions per iteration; the plan gives "
                             f"{[len(f) for f in stage_frequencies]} frequencies (one per instruction, schedule order).")
        return ray.get([s.run_frequency_plan.remote(iterations, f, d)
                        for s, f, d in zip(self.stages, stage_frequencies, devices)])


def start_dedicated_hosts(service, count: int, num_cpus: float = 1, fill_memory_bytes: int | None = None,
                          timeouts: dict | None = None) -> list:
    """Start ``count`` dedicated host actors (``hydro-bubbles/dedicated/<i>``) and register them with the
    placement ``service`` as dedicated slots; returns the actor handles."""
    actor = ray.remote(num_cpus=num_cpus, max_concurrency=4)(DedicatedHost)
    hosts = []
    for i in range(count):
        name = f"hydro-bubbles/dedicated/{i}"
        hosts.append(actor.options(name=name).remote(name, fill_memory_bytes, timeouts, FILL_PRELOAD))
        ray.get(service.add_dedicated.remote(f"dedicated/{i}", ray.get(hosts[-1].fill_budget.remote()), name))
    return hosts


def pickled_workload(spec: TuneSpec) -> bytes:
    """``spec`` as fill processes take it: a cloudpickle, so they need not import the user's workload file."""
    return cloudpickle.dumps(spec)
