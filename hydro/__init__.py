"""Hydro: surrogate-based, fused hyperparameter tuning."""
