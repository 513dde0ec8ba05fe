from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bisect_repro.testing import reproducibility  # noqa: F401 - the fixture, imported as a user's conftest.py would

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
