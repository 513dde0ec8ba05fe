"""How many steps ``doctor`` trains and re-runs when not told: a module of its own, so that the
command line reads it without importing what the audit imports."""

from __future__ import annotations

__all__ = ["DEFAULT_STEPS"]

DEFAULT_STEPS = 3
