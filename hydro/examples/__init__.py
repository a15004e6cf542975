"""Bundled offline examples: plain-torch models and datasets that need no download."""
