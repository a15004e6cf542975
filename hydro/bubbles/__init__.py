"""Bubble Squeezer: fused tuning trials run inside the pipeline bubbles of long-running jobs."""
from .fill import FillSpec, FillTooLarge, FillTrial
from .gate import BubbleGate, FillAborted
from .hooks import Bubble, BubbleListener, BubbleRecorder
from .schedule import one_f_one_b, simulate
from .stage import PipelineSpec, PipelineStage

__all__ = ["Bubble", "BubbleGate", "BubbleListener", "BubbleRecorder", "FillAborted", "FillSpec", "FillTooLarge",
           "FillTrial", "PipelineSpec", "PipelineStage", "one_f_one_b", "simulate"]
