"""The error hierarchy.

Every error bisect-repro raises on purpose is a :class:`BisectReproError`. Its message is one
line that names the file (or run, or target), what is wrong with it, and how to fix it; the CLI
prints it as is and exits with code 2. Anything else escaping the package is a bug.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "BisectReproError",
    "RecipeError",
    "RecordingError",
    "RecordingWarning",
    "RunExistsError",
    "RunFormatError",
    "RunLockedError",
    "RunMismatchError",
    "RunNotFoundError",
    "UnstorableError",
]


class BisectReproError(Exception):
    """Base class: a one-line, user-facing message naming the file, the cause and the fix."""


class RunNotFoundError(BisectReproError):
    """A path given as a run does not exist or is not a bisect-repro run."""


class RunExistsError(BisectReproError):
    """A run directory to record into already holds a run (or other files): nothing is overwritten
    without ``--force``, and a folder that is not a run never is."""


class RunFormatError(BisectReproError):
    """A run file exists but cannot be read: corrupt, truncated, too new, or inconsistent."""

    def __init__(self, path: Path | str, problem: str, fix: str | None = None) -> None:
        self.path = Path(path)
        self.problem = problem
        message = f"{path}: {problem}"
        if fix:
            message += f"; {fix}"
        super().__init__(message)


class RunMismatchError(BisectReproError):
    """Two runs that cannot be compared step by step: another world size or parallel layout."""


class RecipeError(BisectReproError):
    """A TARGET cannot be imported, built or run as a recipe."""


class RecordingError(BisectReproError):
    """Recording could not go on (disk full, permission denied, a file removed underneath)."""


class RunLockedError(RecordingError):
    """Another recorder holds the run directory's lock."""


class UnstorableError(RecordingError, TypeError):
    """A state tree holds an object that only pickle could store."""


class RecordingWarning(UserWarning):
    """Recording stopped after a failed write (``on_error="warn"``); training went on."""
