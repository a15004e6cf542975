"""The tuner on Ray Tune: the ``HydroSearcher`` adapter of the search driver, the fused-trial trainable, per-member
sessions, stopping decisions, results and progress."""
