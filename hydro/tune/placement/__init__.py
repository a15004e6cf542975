"""Heterogeneity-aware, elastic placement of fused trials on a Ray cluster."""
