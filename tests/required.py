"""Tools from outside the package that some tests need: Chromium for the browser test, Triton for
its kernel's test.

On a developer's machine a missing tool skips the test that needs it, naming how to get it. In CI
(``CI=true``, which ``.ci/run`` sets after installing both) a missing tool fails the test instead,
so that a test that stopped running shows up as a failure rather than as one skip among many.

Where the guarantees stop: the check is that the tool is found (on PATH, importable), not that it
works; a broken install fails in the test itself.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing(tool: str, fix: str, *, module_level: bool = False) -> NoReturn:
    """Skip (locally) or fail (in CI) for ``tool`` not found; ``fix`` says how to install it."""
    if in_ci():
        pytest.fail(
            f"{tool} is missing although CI installs it ({fix}): see .ci/run", pytrace=False
        )
    pytest.skip(
        f"{tool} is missing: {fix} (CI installs it and fails without it)",
        allow_module_level=module_level,
    )
