from __future__ import annotations

import json

from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()


def test_record_then_show(examples, tmp_path) -> None:
    out = tmp_path / "runs" / "a"
    result = runner.invoke(
        app,
        [
            "record",
            f"{examples / 'cnn.py'}:build",
            "--out",
            str(out),
            "--steps",
            "12",
            "--every",
            "5",
            "--set",
            "lr=0.002",
            "--set",
            "num_workers=0",
        ],
    )
    assert result.exit_code == 0, result.output
    shown = runner.invoke(app, ["show", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    summary = json.loads(shown.stdout)
    assert (
        summary["complete"]
        and summary["steps_logged"] == 12
        and summary["snapshots"] == [0, 5, 10, 12]
    )
    assert summary["config"] == {"lr": 0.002, "num_workers": 0}
    assert summary["first_loss"] is not None and summary["checkpoints"] == [0]
    verified = runner.invoke(app, ["show", str(out), "--json", "--verify"])
    # 4 snapshots, 1 checkpoint
    assert verified.exit_code == 0 and json.loads(verified.stdout)["verified"] == 5
    (out / "rank0" / "checkpoints" / "step-00000000.st.zst").write_bytes(b"damaged")
    assert runner.invoke(app, ["show", str(out)]).exit_code == 0  # the last snapshot is fine
    damaged = runner.invoke(app, ["show", str(out), "--verify"])
    assert damaged.exit_code == 2 and "step-00000000.st.zst" in damaged.stderr
    human = runner.invoke(app, ["show", str(out)])
    assert (
        human.exit_code == 0 and "complete" in human.stdout and "loader.generator" in human.stdout
    )


def test_record_refuses_an_existing_run_unless_forced(examples, tmp_path) -> None:
    args = [
        "record",
        f"{examples / 'mlp.py'}:build",
        "--out",
        str(tmp_path / "a"),
        "--steps",
        "2",
        "--every",
        "1",
    ]
    assert runner.invoke(app, args).exit_code == 0
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "--force" in again.stderr
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0


def one_line_error(args: list[str], *expected: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    message = result.stderr.strip()
    assert "Traceback" not in result.output and len(message.splitlines()) == 1, message
    for part in expected:
        assert part in message, message


def test_bad_input_is_one_line_and_exit_code_2(examples, tmp_path) -> None:
    one_line_error(["show", str(tmp_path / "nope")], str(tmp_path / "nope"), "no such run")
    (tmp_path / "empty").mkdir()
    one_line_error(["show", str(tmp_path / "empty")], "not a bisect-repro run")
    one_line_error(
        ["record", "examples/none.py:build", "--out", str(tmp_path / "x")],
        "none.py",
        "no such recipe file",
    )
    one_line_error(
        ["record", f"{examples / 'mlp.py'}:nothing", "--out", str(tmp_path / "x")],
        "no function 'nothing'",
    )
    one_line_error(
        [
            "record",
            f"{examples / 'mlp.py'}:build",
            "--out",
            str(tmp_path / "x"),
            "--set",
            "depth=3",
        ],
        "depth",
    )
    one_line_error(
        ["record", f"{examples / 'mlp.py'}", "--out", str(tmp_path / "x")], "expected TARGET"
    )
    one_line_error(
        ["record", f"{examples / 'mlp.py'}:build", "--out", str(tmp_path / "x"), "--every", "0"],
        "--every",
    )
