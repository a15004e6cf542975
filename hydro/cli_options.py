"""What every ``hydro`` sub-command's options share: the usage error ``hydro`` turns into exit code 2, and checked
argparse types. Feature command lines import these from here, not from :mod:`hydro.cli` (which imports them)."""
from __future__ import annotations

import argparse
from collections.abc import Callable


class UsageError(Exception):
    """Bad command-line input, found before any work starts: ``hydro`` prints the message (one line naming the
    problem and the fix) and exits with code 2, as argparse does for its own errors."""


def checked(convert: Callable[[str], float], ok: Callable[[float], bool], rule: str) -> Callable[[str], float]:
    """An argparse ``type``: ``convert(text)`` if ``ok`` accepts it, else an error naming ``rule`` (argparse
    prints it after the option's name, e.g. "argument --seeds: must be >= 1, got 0", and exits with code 2)."""
    noun = "an integer" if convert is int else "a number"

    def parse(text: str) -> float:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {value}")
        return value

    return parse


def at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``low``."""
    return checked(int, lambda value: value >= low, f">= {low}")
