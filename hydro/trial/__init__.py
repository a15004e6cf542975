"""What runs inside one tuning trial, without Ray: the workload (``TuneSpec``), the trial's plan (which
members, at which scale), the members built, shrunk, fused and given one translated optimizer, and their
training and evaluation."""
from hydro.trial.spec import TuneSpec, accuracy

__all__ = ["TuneSpec", "accuracy"]
