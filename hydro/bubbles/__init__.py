"""Bubble Squeezer: Hydro's fused trials run inside the pipeline bubbles of long-running jobs."""
from .fill_process import EpochResult, FailureKind, FillFailed, FillFailure, FillProcess, FillTooLarge
from .gate import BubbleGate, FillAborted, UnitNeverFits
from .hooks import Bubble, BubbleListener, BubbleRecorder
from .host import DedicatedHost, FillHost, SlotMode
from .layer_gate import LayerGate
from .schedule import one_f_one_b, simulate
from .stage import PipelineSpec, PipelineStage

__all__ = ["Bubble", "BubbleGate", "BubbleListener", "BubbleRecorder", "DedicatedHost", "EpochResult", "FailureKind",
           "FillAborted", "FillFailed", "FillFailure", "FillHost", "FillProcess", "FillTooLarge", "LayerGate",
           "PipelineSpec", "PipelineStage", "SlotMode", "UnitNeverFits", "one_f_one_b", "simulate"]
