"""Predict before running: a fused trial's step time and memory (:mod:`.step_time`), a member's final metric
and remaining epochs (:mod:`.convergence`), and a data-parallel job's energy (:mod:`.energy_model`)."""
