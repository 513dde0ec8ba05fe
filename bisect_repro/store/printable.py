"""Text from a run, made safe to show: what a terminal receives is what the run says, visibly.

A run directory is hostile input, and its strings (argv, paths, config values, stream names)
reach the terminal in the replay announcement and the reports. :func:`printable` replaces every
control character (C0, DEL, C1: an ``ESC[2K`` could erase the line above it) by a visible escape,
and the CLI prints the result with rich markup off, so ``[red]`` stays four characters of text.
"""

from __future__ import annotations

import re

__all__ = ["printable"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` with every control or bidirectional-override character written as an escape (``\\x1b``)."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), str(text))
