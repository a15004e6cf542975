"""Bubble Squeezer: Hydro's fused trials run inside the pipeline bubbles of long-running jobs (the pipeline side,
stages and where they idle, is :mod:`hydro.pipeline`)."""
from .fill_process import EpochResult, FailureKind, FillFailed, FillFailure, FillProcess, FillTooLarge
from .gate import BubbleGate, FillAborted, UnitNeverFits
from .host import DedicatedHost, FillHost, SlotMode
from .layer_gate import LayerGate

__all__ = ["BubbleGate", "DedicatedHost", "EpochResult", "FailureKind", "FillAborted", "FillFailed", "FillFailure",
           "FillHost", "FillProcess", "FillTooLarge", "LayerGate", "SlotMode", "UnitNeverFits"]
