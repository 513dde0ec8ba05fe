"""A script's command line as its config (record/arguments.py): flag by flag, argparse's values,
secrets redacted."""

from __future__ import annotations

import argparse
import sys

import pytest

from bisect_repro.record.arguments import argv_flags, capture_arguments, shown_command, shown_value


def test_a_command_line_is_read_flag_by_flag_with_positional_words_by_position() -> None:
    argv = [
        "train.py",
        "data",
        "--gamma",
        "0.5",
        "--dry-run",
        "--lr=0.1",
        "--shift",
        "-1",
        "--name",
        "x y",
        "--",
        "--raw",
    ]
    assert argv_flags(argv) == {
        "argv[1]": "data",
        "--gamma": "0.5",
        "--dry-run": True,
        "--lr": "0.1",
        "--shift": "-1",  # a negative number is a value, not a flag
        "--name": "x y",
        "argv[2]": "--raw",  # after --, every word is positional
    }


def test_a_secrets_value_is_kept_as_a_digest_that_still_tells_two_secrets_apart() -> None:
    one, two = (
        argv_flags(["t.py", "--api-key", "abc"])["--api-key"],
        argv_flags(["t.py", "--api-key=abd"])["--api-key"],
    )
    assert one.startswith("<redacted sha256:") and "abc" not in one and one != two
    assert shown_value("--password", None) is None and shown_value("--lr", 0.1) == 0.1


def test_commands_are_shown_quoted_with_control_characters_escaped_and_secrets_redacted() -> None:
    shown = shown_command(
        ["t.py", "--token", "abc", "--password=xyz", "--note", "a\nb", "--lr", "1"]
    )
    assert shown == "--token REDACTED --password=REDACTED --note 'a\\nb' --lr 1"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("-g", "--gamma", type=float, default=0.7)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--milestones", type=int, nargs="*", default=[3, 6])
    parser.add_argument("--device", type=lambda s: object(), default=None)
    parser.add_argument("--hf-token", default="t")
    return parser


def test_the_first_parse_of_sys_argv_is_captured_with_its_defaults_keyed_by_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found: dict[str, object] = {}
    undo = capture_arguments(found)
    try:
        _parser().parse_args(["other", "--epochs", "9"])  # a list of its own: not the command line
        assert found == {}
        monkeypatch.setattr(sys, "argv", ["train.py", "d", "-g", "0.5", "--device", "cpu"])
        _parser().parse_args()
        _parser().parse_args()  # only the first parse counts
    finally:
        undo()
    assert {k: v for k, v in found.items() if k not in ("--device", "--hf-token")} == {
        "data": "d",
        "--gamma": 0.5,
        "--epochs": 2,
        "--milestones": [3, 6],
    }
    assert isinstance(found["--device"], str) and str(found["--hf-token"]).startswith(
        "<redacted sha256:"
    )
    # undone
    assert (
        argparse.ArgumentParser.parse_known_args.__qualname__ == "ArgumentParser.parse_known_args"
    )
