"""The reference pipeline job on Ray: one actor per stage (:mod:`hydro.pipeline` is the job itself)."""
