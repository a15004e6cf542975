"""The ``hydro`` command line: one sub-command per feature, each registered by its own module."""
from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Sequence

from hydro.cli_options import UsageError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hydro", description="Hydro hyperparameter tuning on Ray Tune.")
    sub = parser.add_subparsers(dest="command", required=True)
    # Each feature adds its sub-command here: ``module.add_subparser(sub)`` sets ``func`` on its parser.
    for register in _registrars():
        register(sub)
    return parser


def _registrars():
    from hydro import demo
    from hydro.energy import cli as energy_cli
    from hydro.tune import cli as tune_cli

    return [demo.add_subparser, energy_cli.add_subparser, tune_cli.add_subparser]


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Library modules log under "hydro.*"; the command line shows their INFO messages (searcher decisions,
    # fusion plans) on stderr. Ray's worker processes keep their own logging set-up.
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("hydro").setLevel(logging.INFO)
    library_format, warnings.formatwarning = warnings.formatwarning, _one_line  # the warning, not the line
    try:                                                                          # of library code raising it
        return int(args.func(args) or 0)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    finally:
        warnings.formatwarning = library_format


def _one_line(message, category, filename, lineno, line=None) -> str:
    return f"{category.__name__}: {message}\n"


if __name__ == "__main__":
    sys.exit(main())
