"""The search's surrogate scale, measured on this process's device when the user lets Hydro choose
(``scale="auto"``): fused training steps of the workload's µP surrogates at S=8, 4, 2, and the choice of
:func:`schedulers.scale_choice.choose_scale` (the finest scale whose step costs at most 2.5 times the coarsest's);
then, where it chose S >= 8, the :class:`~schedulers.scale_choice.Pilot` that checks S ranks like S/2."""
from __future__ import annotations

import copy
import logging
import time
from collections.abc import Mapping, Sequence

import torch

from hydro.fusion_measure import measure_fusion
from hydro.profiling import torch_threads, user_cpu_s
from hydro.shrink.errors import ShrinkError
from hydro.trial.data import DataSource
from hydro.trial.plan import TrialKind, TrialPlan
from hydro.trial.precision import autocast
from hydro.trial.spec import TuneSpec
from hydro.trial.surrogate import build_member
from hydro.trial.unit import FusedTrial
from schedulers.scale_choice import (AUTO_SCALES, PILOT_CONFIGS, PILOT_EPOCH_SHARE, CannotShrink, Pilot,
                                     ScaleChoice, choose_scale)

logger = logging.getLogger(__name__)

MEASURED_MEMBERS = 16  # members fused in a timed step (at most): a search's trials fuse about as many or more
MIN_STEPS, MIN_TIME_S = 3, 0.1  # per timing, after a warm-up step: enough that millisecond steps are not noise


def measured_scale(spec: TuneSpec, config: Mapping, data: tuple[DataSource, DataSource], members: int,
                   threads: int, device: torch.device | None = None,
                   scales: Sequence[int] = AUTO_SCALES) -> ScaleChoice:
    """The scale a search of ``spec`` trains its surrogates at: ``min(members, 16)`` µP surrogates of
    ``config`` fused and trained on one batch of ``data``'s training split, on ``device`` (default: this
    process's GPU, else CPU) with ``threads`` torch threads, in ``spec.precision``, at each of ``scales`` (coarse to
    fine; default :data:`~schedulers.scale_choice.AUTO_SCALES`) in turn (a scale the model cannot be shrunk to is
    skipped; :class:`~schedulers.scale_choice.NoScale` if none is left).
    Steps are timed by the process's user CPU time on a CPU (neither other processes' load nor a fresh process's
    page faults count), by the wall clock on a GPU."""
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    clock = user_cpu_s if device.type == "cpu" else time.perf_counter
    x, y = data[0].sample(spec.batch_size_of(config))
    count = max(1, min(members, MEASURED_MEMBERS))
    templates: dict[int, torch.nn.Module] = {}  # one shrink per scale, timed in every round

    def step_seconds(scale: int) -> float:
        if scale not in templates:
            try:
                templates[scale] = build_member(spec.model, config, scale, shrink_options=spec.shrink_options())
            except ShrinkError as error:
                raise CannotShrink(str(error)) from error
        template = templates[scale]
        with torch_threads(threads), autocast(device, spec.precision):  # initial values do not matter
            return measure_fusion(lambda: copy.deepcopy(template), (x, y), spec.loss, count, device, MIN_STEPS,
                                  MIN_TIME_S, clock, memory=False).step_time_s

    choice = choose_scale(step_seconds, scales)
    logger.info("scale='auto': S=%d for the search on %s (%d fused members, %d threads): %s", choice.scale,
                device, count, threads, choice.reason)
    return choice


def piloted_scale(spec: TuneSpec, choice: ScaleChoice, configs: Sequence[Mapping],
                  data: tuple[DataSource, DataSource], members: int, threads: int,
                  device: torch.device | None = None, pilot_configs: int = PILOT_CONFIGS,
                  epoch_share: int = PILOT_EPOCH_SHARE) -> ScaleChoice:
    """``choice`` checked by its :class:`~schedulers.scale_choice.Pilot` for a search of ``members``
    configurations (``None``: nothing to check, ``choice`` returned): the first ``Pilot.configs`` of ``configs``
    trained as µP surrogates, fused, at the pilot's two scales for its epochs (the search's first ones), on ``device`` (default: this
    process's GPU, else CPU) with ``threads`` torch threads; its cost is logged before it trains.
    ``pilot_configs``, ``epoch_share``: :meth:`Pilot.plan <schedulers.scale_choice.Pilot.plan>`'s ``configs`` and
    ``epoch_share``.

    With fewer ``configs`` than the pilot trains (no param space to draw them from) the step times decide alone.
    """
    pilot = Pilot.plan(choice.scale, members, spec.epochs, pilot_configs, epoch_share)
    if pilot is None:
        return choice
    if len(configs) < pilot.configs:
        logger.info("scale='auto': S=%d from step times alone: the pilot needs %d configurations, got %d (no param "
                    "space to draw them from)", choice.scale, pilot.configs, len(configs))
        return choice
    logger.info("scale='auto': S=%d from step times; %s", choice.scale, pilot.describe())
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    members_of = [(f"pilot{i}", dict(config)) for i, config in enumerate(configs[:pilot.configs])]
    values = {}
    with torch_threads(threads):
        for scale in (pilot.coarse, pilot.fine):
            trial = FusedTrial(spec, TrialPlan(TrialKind.SURROGATE, members_of, scale, mup=True), data,
                               device=device)
            for _ in range(pilot.epochs):
                trial.train_epoch()
            values[scale] = dict(zip(trial.member_ids, trial.evaluate()[spec.metric].tolist()))
            trial.close()
    decided = pilot.decide(choice, values[pilot.coarse], values[pilot.fine], spec.mode)
    logger.info("scale='auto': S=%d for the search: %s", decided.scale, decided.reason)
    return decided

