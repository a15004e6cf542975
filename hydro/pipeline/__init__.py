"""The reference pipeline job in plain torch: its 1F1B schedule and timeline, its stages over
``torch.distributed`` point-to-point, where a stage idles (bubbles, announced to a listener), and its energy
profiler. Ray's side (stage actors) is :mod:`hydro.tune.pipeline`."""
from .hooks import Bubble, BubbleListener, BubbleRecorder
from .schedule import one_f_one_b, simulate
from .stage import PipelineSpec, PipelineStage

__all__ = ["Bubble", "BubbleListener", "BubbleRecorder", "PipelineSpec", "PipelineStage", "one_f_one_b", "simulate"]
