"""Energy on Ray Tune: the scheduler that energy-tunes trials, and the ``hydro tune --energy`` options."""
