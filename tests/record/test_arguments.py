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


def test_the_parses_of_the_command_line_are_captured_with_their_defaults_keyed_by_flag() -> None:
    found: dict[str, object] = {}
    argv = ["train.py", "d", "-g", "0.5", "--device", "cpu"]
    undo = capture_arguments(found, argv)
    try:
        assert found == {"argv[1]": "d", "-g": "0.5", "--device": "cpu"}  # the flags at once
        _parser().parse_args(["other", "--epochs", "9"])  # a list of its own: not the command line
        assert found == {"argv[1]": "d", "-g": "0.5", "--device": "cpu"}
        _parser().parse_args(argv[1:])
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


def test_a_config_parser_read_first_and_the_main_parser_on_the_rest_are_both_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The shape of the big image-classification trainers: ``parse_known_args`` of a config
    parser, then the main parser on what it left, with a worker count given as ``-j``."""
    monkeypatch.setattr(sys, "argv", ["train.py", "-c", "base.json", "-j", "2", "--lr=0.1"])
    found: dict[str, object] = {}
    undo = capture_arguments(found)
    try:
        config = argparse.ArgumentParser(add_help=False)
        config.add_argument("-c", "--config", default="")
        _, remaining = config.parse_known_args()
        assert found["--config"] == "base.json" and found["-j"] == "2"  # -j not parsed yet
        main = argparse.ArgumentParser()
        main.add_argument("-j", "--workers", type=int, default=4)
        main.add_argument("--lr", type=float, default=1.0)
        main.parse_args(remaining)
    finally:
        undo()
    assert found == {"--config": "base.json", "--workers": 2, "--lr": 0.1}


def test_flags_no_parser_reads_and_overrides_are_the_config(monkeypatch) -> None:
    """A script that reads its command line with ``fire``, ``click``, Hydra or by hand: the flags
    and ``key=value`` overrides, with a parser that reads only some of them."""
    found: dict[str, object] = {}
    argv = ["train.py", "optimizer.lr=0.1", "+trainer.devices=2", "--seed", "3", "data"]
    undo = capture_arguments(found, argv)
    try:
        assert found == {
            "optimizer.lr": "0.1",
            "+trainer.devices": "2",
            "--seed": "3",
            "argv[1]": "data",
        }
        parser = argparse.ArgumentParser()
        parser.add_argument("--seed", type=int)
        parser.parse_known_args(argv[1:])
    finally:
        undo()
    assert found == {"optimizer.lr": "0.1", "+trainer.devices": "2", "argv[1]": "data", "--seed": 3}
