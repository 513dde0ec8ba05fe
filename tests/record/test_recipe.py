from __future__ import annotations

import pytest

from bisect_repro.errors import RecipeError
from bisect_repro.record.recipe import Trainee, build, parse_settings


def test_settings_are_json_literals_or_strings() -> None:
    assert parse_settings(
        ["a=3", "b=0.1", "c=true", "d=null", 'e="x"', "f=hello", "g=[1, 2]", "h=a=b"]
    ) == {
        "a": 3,
        "b": 0.1,
        "c": True,
        "d": None,
        "e": "x",
        "f": "hello",
        "g": [1, 2],
        "h": "a=b",
    }


@pytest.mark.parametrize("bad", ["novalue", "=3", "not an id=3"])
def test_malformed_settings_are_refused(bad: str) -> None:
    with pytest.raises(RecipeError, match="KEY=VALUE"):
        parse_settings([bad])


def test_a_file_target_can_import_its_neighbours(tmp_path) -> None:
    (tmp_path / "helper.py").write_text("WIDTH = 3\n")
    (tmp_path / "recipe.py").write_text(
        "import torch\nfrom helper import WIDTH\nfrom bisect_repro import Trainee\n"
        "def build(lr=0.1):\n"
        "    m = torch.nn.Linear(WIDTH, 1)\n"
        "    return Trainee(m, torch.optim.SGD(m.parameters(), lr=lr), [torch.ones(WIDTH)], lambda "
        "b: m(b).sum())\n"
    )
    trainee = build(f"{tmp_path / 'recipe.py'}:build", {"lr": 0.5})
    assert trainee.optimizer.param_groups[0]["lr"] == 0.5
    assert build(f"{tmp_path / 'recipe.py'}:build").model is not trainee.model


def test_module_targets_and_wrong_returns(tmp_path) -> None:
    with pytest.raises(RecipeError, match="returned a dict"):
        (tmp_path / "bad.py").write_text("def build():\n    return {}\n")
        build(f"{tmp_path / 'bad.py'}:build")
    with pytest.raises(RecipeError, match="cannot import"):
        build("no_such_package_xyz.recipes:build")
    with pytest.raises(RecipeError, match=r"failed while building .*boom"):
        (tmp_path / "boom.py").write_text("def build():\n    raise ValueError('boom')\n")
        build(f"{tmp_path / 'boom.py'}:build")


def test_trainee_checks_its_fields() -> None:
    with pytest.raises(RecipeError, match=r"torch\.nn\.Module"):
        Trainee("model", None, [], None)  # type: ignore[arg-type]


def test_the_stateful_pieces_follow_the_protocol() -> None:
    import torch

    from bisect_repro.capture.data import DataStream
    from bisect_repro.capture.rng import RandomStreams
    from bisect_repro.capture.state import TrainingState
    from bisect_repro.stateful import Stateful

    model = torch.nn.Linear(2, 1)
    trainee = Trainee(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        [torch.ones(2)],
        lambda b: model(b).sum(),
    )
    state = TrainingState(trainee)
    for piece in (
        state,
        state.streams,
        state.data,
        RandomStreams(),
        DataStream([1], RandomStreams()),
    ):
        assert isinstance(piece, Stateful)
    with pytest.raises(RecipeError, match="scheduler"):
        Trainee(model, trainee.optimizer, [], None, scheduler=object())  # type: ignore[arg-type]
