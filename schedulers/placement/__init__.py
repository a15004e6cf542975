"""Heterogeneity-aware, elastic placement of fused tuning trials: the cluster model (:mod:`.cluster`), the
placement policies (:mod:`.policies`) and a trace-driven simulator of a stream of tuning jobs
(:mod:`.simulator`)."""
