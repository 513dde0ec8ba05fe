from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from bisect_repro.testing import reproducibility  # noqa: F401 - the fixture, imported as a user's conftest.py would
from tests.rules_check import every_comparison_is_checked  # noqa: F401 - autouse: every comparison's verdict obeys its rule

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--extended",
        action="store_true",
        help="run the tests marked extended too: every corpus case, every resume case",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skips = {
        "extended": None
        if config.getoption("--extended")
        else pytest.mark.skip(reason="an extended case, outside CI's time: run with --extended"),
        "cuda": None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA GPU"),
    }
    for item in items:
        for keyword, skip in skips.items():
            if skip is not None and keyword in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True, scope="session")
def signing_key_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The runs the tests record are signed with a key of the test session (and its subprocesses),
    never with the key in the user's own configuration folder."""
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))


@pytest.fixture
def examples() -> Path:
    return EXAMPLES
