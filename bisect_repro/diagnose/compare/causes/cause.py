"""The causes ``compare`` may name: the values of ``verdict.cause`` in ``compare --json``.

Each member has exactly one entry in the registry
(:data:`~bisect_repro.diagnose.compare.causes.registry.REGISTRY`), which holds everything else
about it; the registry refuses to load otherwise.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Cause"]


class Cause(str, Enum):
    """Why two runs part ways (``verdict.cause``)."""

    RNG_STATE = "rng_state"
    DATA_ORDER = "data_order"
    DATA_CONTENT = "data_content"
    NONDETERMINISTIC_OP = "nondeterministic_op"
    ENVIRONMENT = "environment"
    CODE = "code"
    RESUME = "resume"
    CONFIG = "config"
    STRUCTURE = "structure"
    HIDDEN_STATE = "hidden_state"
    UNKNOWN = "unknown"
