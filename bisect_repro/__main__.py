"""The command line's entry (the ``bisect-repro`` console script, ``python -m bisect_repro``).

For ``compare`` (unless ``--no-replay``), it starts a fork server before importing the command
line and torch (:mod:`bisect_repro.replay.prestart`); then it runs the command line.
"""

from __future__ import annotations

import sys

__all__ = ["main"]


def _command(argv: list[str]) -> str | None:
    """The command named in ``argv`` (the first word that is not an option)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main() -> None:
    arguments = sys.argv[1:]
    if (
        _command(arguments) == "compare"
        and "--no-replay" not in arguments
        and "--help" not in arguments
    ):
        from .replay.prestart import prestart

        prestart()
    from .cli import main as run

    run()


if __name__ == "__main__":
    main()
