"""Decisions across trials and jobs: energy knobs, bubble placement."""
