"""What a replaying process wrote: the last line of its output, quoted when it dies or never
connects.

Where the guarantees stop: only the last line is quoted (at most 300 characters); the last 40 are
logged at debug level, and the rest stays in the log file.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

_log = logging.getLogger(__name__)

__all__ = ["last_line"]


def last_line(log: Path, strip: Callable[[str], str] = str) -> str:
    """The last line a process wrote to ``log`` (``strip`` applied, at most 300 characters; ``no
    output``: none), logged in full."""
    try:
        lines = [
            line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()
        ]
    except OSError:
        lines = []
    if not lines:
        return "no output"
    _log.debug("the last output of %s:\n%s", log, "\n".join(lines[-40:]))
    return strip(lines[-1])[:300]
