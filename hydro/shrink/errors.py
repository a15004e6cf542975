"""The error ``hydro.shrink`` raises for a model it cannot shrink."""


class ShrinkError(ValueError):
    """The model cannot be shrunk as asked; the message names the layer (or node) and the fix."""
