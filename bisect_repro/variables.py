"""Environment variables that bisect-repro's own processes set for one another, named once here,
in a module that imports nothing, so that a process may set one before it imports torch."""

from __future__ import annotations

__all__ = ["DEFER_VARIABLE", "PRIVATE_PREFIX"]

DEFER_VARIABLE = "BISECT_REPRO_DEFER_VML"
"""Set (to anything) in a process that forks copies of itself: MKL's first vector-math call is
left to each copy (:mod:`bisect_repro.capture.vml`)."""

PRIVATE_PREFIX = "BISECT_REPRO_"
"""Variables with this prefix are one process's own: a replaying process never inherits them."""
