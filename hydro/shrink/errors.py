"""What ``hydro.shrink`` raises for a model it cannot shrink, and warns about widths it keeps."""


class ShrinkError(ValueError):
    """The model cannot be shrunk as asked; the message names the layer (or node) and the fix."""


class ShrinkWarning(UserWarning):
    """``hydro.shrink`` kept some widths at full size (no shrink rule, or below ``min_width``); the message
    lists them. µP treats kept widths as finite dimensions, so transfer still holds for the scaled ones."""
