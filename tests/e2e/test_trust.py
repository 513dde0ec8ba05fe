"""A run directory never decides what code runs: attacks on ``compare`` by editing ``run.json``.

Each attack edits a genuine pair of runs the way someone handing them over could, then runs
``compare`` through the CLI. The payload of every attack creates a canary file; the test asserts
that the canary never appears, that the answer is a verdict or one error line (never a
traceback), and, where consent was given, that what still ran is the user's own recipe.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bisect_repro.cli import app

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def payload(canary: Path) -> str:
    return f"open({str(canary)!r}, 'w').write('ran')\n"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of a recipe whose models start apart (no seed): compare replays them."""
    folder = tmp_path_factory.mktemp("trust")
    (folder / "code").mkdir()
    shutil.copy(EXAMPLES / "unseeded_init.py", folder / "code" / "recipe.py")
    for name in "ab":
        result = runner.invoke(
            app,
            [
                "record",
                f"{folder / 'code' / 'recipe.py'}:build",
                "--out",
                str(folder / name),
                "--quiet",
                "--steps",
                "2",
                "--every",
                "1",
            ],
        )
        assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def pair(recorded: Path, tmp_path: Path) -> tuple[Path, Path]:
    for name in "ab":
        shutil.copytree(recorded / name, tmp_path / name)
    return tmp_path / "a", tmp_path / "b"


def edit(run: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((run / "run.json").read_text())
    change(meta)
    (run / "run.json").write_text(json.dumps(meta))


def compare(a: Path, b: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    result = runner.invoke(app, ["compare", str(a), str(b), "--json", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout), result.stderr


def no_replay_note(report: dict[str, Any]) -> str:
    notes = [note for note in report["notes"] if note.startswith("no replay")]
    assert not report["replay"]["performed"] and notes, report
    return notes[0]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


STDLIB = Path(sysconfig.get_paths()["stdlib"])


def test_runs_this_user_recorded_replay_with_no_flag_and_are_announced(
    pair: tuple[Path, Path],
) -> None:
    code, report, stderr = compare(*pair)
    assert code == 1 and report["replay"]["performed"], report["notes"]
    assert report["verdict"]["step"] == 0 and report["verdict"]["phase"] == "init"
    recipe = pair[0].parent / "a" / "run.json"
    assert recipe.exists()
    recorded = json.loads(recipe.read_text())["launch"]["code"]
    assert f"file: {recorded['path']} (sha256 {recorded['sha256']})" in stderr
    assert "working directory:" in stderr


def test_an_edited_run_needs_consent_and_then_replays(pair: tuple[Path, Path]) -> None:
    a, b = pair
    # the launch claim changed: the signature no longer holds
    edit(b, lambda meta: meta["config"].update(seed=None))
    code, report, _ = compare(a, b)
    assert code == 1 and "run B was not recorded by you on this machine" in no_replay_note(report)
    assert "--trust" in no_replay_note(report) and report["verdict"]["confidence"] == "inferred"
    code, report, _ = compare(a, b, "--trust")
    assert code == 1 and report["replay"]["performed"], report["notes"]


def test_runs_signed_with_another_users_key_need_consent(
    pair: tuple[Path, Path], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "someone-else"))
    _, report, _ = compare(*pair)
    assert "run A and run B were not recorded by you" in no_replay_note(report)


def recipe_named(
    target: str, path: Path | None, digest: str | None, config: dict[str, Any]
) -> Callable[[dict[str, Any]], None]:
    def change(meta: dict[str, Any]) -> None:
        meta["target"], meta["config"] = target, config
        meta["launch"]["code"] = {
            "kind": "recipe",
            "target": target,
            "path": str(path) if path else None,
            "sha256": digest,
        }

    return change


def script_named(
    path: Path,
    digest: str | None,
    argv: list[str],
    kind: str = "script",
    module: str | None = None,
    cwd: str | None = None,
):
    def change(meta: dict[str, Any]) -> None:
        meta["target"] = None
        meta["launch"]["argv"] = argv
        meta["launch"]["cwd"] = cwd or meta["launch"]["cwd"]
        meta["launch"]["code"] = {
            "kind": kind,
            "path": str(path),
            "sha256": digest,
            **({"module": module} if module else {}),
        }

    return change


ATTACKS = {
    "a builtin as the target, no file": lambda canary, run: (
        recipe_named("os:system", None, None, {"command": f"touch {canary}"}),
        "names no recipe file with its SHA-256",
    ),
    "a standard-library function with its real hash": lambda canary, run: (
        recipe_named(
            f"{STDLIB / 'subprocess.py'}:getoutput",
            STDLIB / "subprocess.py",
            sha256(STDLIB / "subprocess.py"),
            {"cmd": f"touch {canary}"},
        ),
        "standard library",
    ),
    "a standard-library module run with -s": lambda canary, run: (
        script_named(
            STDLIB / "timeit.py",
            sha256(STDLIB / "timeit.py"),
            ["timeit", "-s", payload(canary)],
            kind="module",
            module="timeit",
        ),
        "standard library",
    ),
    "a script stored inside the run directory, its hash correct": lambda canary, run: (
        script_named(run / "evil.py", sha256(run / "evil.py"), ["evil.py"]),
        "inside the run directory",
    ),
    "a script with no hash": lambda canary, run: (
        script_named(run.parent / "evil.py", None, ["evil.py"]),
        "with its SHA-256",
    ),
    "a module name not tied to the hashed file": lambda canary, run: (
        script_named(
            run.parent / "evil.py",
            sha256(run.parent / "evil.py"),
            ["x"],
            kind="module",
            module="json.tool",
        ),
        "is not the recorded file",
    ),
    "a path too long to look at, in a working directory too long": lambda canary, run: (
        script_named(
            Path("/" + "x" * 5000) / "train.py", "0" * 64, ["train.py"], cwd="/" + "y" * 5000
        ),
        "is not on this machine",
    ),
    "a relative path": lambda canary, run: (
        script_named(Path("evil.py"), sha256(run.parent / "evil.py"), ["evil.py"]),
        "not an absolute path",
    ),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_crafted_launch_runs_nothing_even_with_consent(
    attack: str, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    a, b = pair
    canary = tmp_path / "canary"
    for folder in (b, tmp_path):
        (folder / "evil.py").write_text(payload(canary))
    change, refusal = ATTACKS[attack](canary, b)
    edit(b, change)
    for consent in ((), ("--trust",)):
        _, report, stderr = compare(a, b, *consent)
        assert refusal in no_replay_note(report), report["notes"]
        assert not canary.exists(), f"{attack}: the run's code ran"
        assert "replaying run" not in stderr


def test_the_working_directory_and_variables_of_a_run_load_no_code(
    pair: tuple[Path, Path], tmp_path: Path
) -> None:
    """With consent the user's own recipe is replayed, and nothing else: not the modules planted in
    the recorded working directory, not a PYTHONPATH or LD_PRELOAD, not a log folder outside."""
    a, b = pair
    canary, planted, logs = tmp_path / "canary", tmp_path / "planted", tmp_path / "logs"
    planted.mkdir()
    logs.mkdir()
    for name in (
        "random.py",
        "numpy.py",
        "sitecustomize.py",
        "typing_extensions.py",
        "bisect_repro.py",
    ):
        (planted / name).write_text(payload(canary))
    (planted / "torch").mkdir()
    (planted / "torch" / "__init__.py").write_text(payload(canary))

    def plant(meta: dict[str, Any]) -> None:
        meta["launch"]["cwd"] = str(planted)
        meta["environment"].update(
            {
                "env.PYTHONPATH": str(planted),
                "env.LD_PRELOAD": str(planted / "x.so"),
                "env.BISECT_REPRO_RANK_LOGS": str(logs),
            }
        )

    for run in (a, b):
        edit(run, plant)
    code, report, stderr = compare(a, b, "--trust")
    assert code == 1 and report["replay"]["performed"], report["notes"]
    assert report["verdict"]["phase"] == "init" and report["verdict"]["confidence"] == "proven"
    assert not canary.exists() and list(logs.iterdir()) == []
    assert (
        f"working directory: {planted}" in stderr
        and "PYTHONPATH" not in stderr
        and "LD_PRELOAD" not in stderr
    )


def test_the_announcement_cannot_lie_to_the_terminal(pair: tuple[Path, Path]) -> None:
    a, b = pair
    edit(b, lambda meta: meta["config"].update(seed="\x1b[2K\x1b[1G[red]fine[/red]"))
    _, report, stderr = compare(a, b)
    note = no_replay_note(report)
    assert (
        "\x1b" not in stderr
        and "\x1b" not in note
        and "\\x1b[2K" in note
        and "[red]fine[/red]" in note
    )
    result = subprocess.run(
        [sys.executable, "-m", "bisect_repro.cli", "compare", str(a), str(b), "--trust"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode in (0, 1), result.stderr
    assert "\x1b[2K" not in result.stderr and "\\x1b[2K\\x1b[1G[red]fine[/red]" in " ".join(
        result.stderr.split()
    )


MALFORMED = {
    "launch a list": lambda meta: meta.update(launch=[1]),
    "code a string": lambda meta: meta["launch"].update(code="x"),
    "cwd a number": lambda meta: meta["launch"].update(cwd=3),
    "argv a number": lambda meta: meta["launch"].update(argv=3),
    "argv holding a number": lambda meta: meta["launch"].update(argv=["x", 3]),
    "an unknown code kind": lambda meta: meta["launch"]["code"].update(kind="shell"),
    "a variable name with =": lambda meta: meta["environment"].update({"env.A=B": "1"}),
    "a variable name with NUL": lambda meta: meta["environment"].update({"env.A\x00": "1"}),
    "a value with NUL": lambda meta: meta["environment"].update({"env.OMP_NUM_THREADS": "1\x00"}),
    "a thread count of a billion": lambda meta: meta["environment"].update(
        {"torch.get_num_threads": 10**9}
    ),
    "options a list": lambda meta: meta.update(options=[]),
    "every zero": lambda meta: meta["options"].update(every=0),
    "a model shape of text": lambda meta: meta["model"]["parameters"].update(x=["big", "float32"]),
    "a signature of text": lambda meta: meta.update(signature="trust me"),
}


@pytest.mark.parametrize("field", list(MALFORMED))
def test_a_malformed_field_is_one_line_and_exit_2(field: str, pair: tuple[Path, Path]) -> None:
    a, b = pair
    edit(b, MALFORMED[field])
    for command in (
        ["show", str(b)],
        ["compare", str(a), str(b)],
        ["compare", str(a), str(b), "--no-replay", "--json"],
    ):
        result = runner.invoke(app, command)
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (
            field,
            result.output,
        )
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {b / 'run.json'}: "), (
            field,
            result.stderr,
        )


def test_consent_is_asked_with_what_would_run_and_decides(pair: tuple[Path, Path]) -> None:
    from bisect_repro.diagnose.compare.compare import compare as compare_runs

    a, b = pair
    edit(b, lambda meta: meta["config"].update(seed=None))
    asked: list[list[tuple[str, list[str]]]] = []

    def consent(answer: bool):
        def ask(foreign) -> bool:
            asked.append([(label, spec.announcement()) for label, spec in foreign])
            return answer

        return ask

    refused = compare_runs(a, b, consent=consent(False))
    assert not refused.replay.performed and [label for label, _ in asked[0]] == ["B"]
    assert (
        asked[0][0][1][1].startswith("file: ") and "/code/recipe.py (sha256 " in asked[0][0][1][1]
    )
    allowed = compare_runs(a, b, consent=consent(True))
    assert allowed.replay.performed and len(asked) == 2
    assert not compare_runs(a, b).replay.performed  # the API's default: no consent


def answered(a: Path, b: Path, answer: bytes) -> tuple[int, str]:
    """``compare`` at a terminal (a pseudo-terminal), answering its prompt with ``answer``."""
    import os
    import pty
    import select
    import time

    try:
        leader, follower = pty.openpty()
    except OSError as error:  # a sandbox without pseudo-terminals
        pytest.skip(f"no pseudo-terminal here ({error})")
    process = subprocess.Popen(
        [sys.executable, "-m", "bisect_repro.cli", "compare", str(a), str(b)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
    )
    os.close(follower)
    seen, deadline, sent = b"", time.monotonic() + 240, False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        if not sent and b"Run this code here to replay it?" in seen:
            os.write(leader, answer)
            sent = True
        if process.poll() is not None and not ready:
            break
    code = process.wait(timeout=60)
    os.close(leader)
    return code, seen.decode(errors="replace")


def test_at_a_terminal_the_user_is_shown_what_would_run_and_decides(
    pair: tuple[Path, Path],
) -> None:
    a, b = pair
    edit(b, lambda meta: meta["config"].update(seed=None))
    code, seen = answered(a, b, b"n\r")
    flat = " ".join(seen.split())
    assert (
        code == 1
        and "Run B was not recorded by you on this machine." in flat
        and "/code/recipe.py (sha256" in flat
    )
    assert "replaying run B would run:" in flat and "/code/recipe.py:build --set" in flat
    assert "no replay: run B was not recorded by you" in flat and "by running" not in flat
    code, seen = answered(a, b, b"y\r")
    assert code == 1 and "replaying run B by running" in " ".join(seen.split())


def test_show_says_whether_compare_will_replay_a_run_without_asking(
    pair: tuple[Path, Path],
) -> None:
    a, b = pair
    edit(b, lambda meta: meta["launch"].update(cwd="/"))
    summaries = [
        json.loads(runner.invoke(app, ["show", str(run), "--json"]).stdout) for run in (a, b)
    ]
    assert [s["recorded_by_you"] for s in summaries] == [True, False]
    text = runner.invoke(app, ["show", str(b)]).stdout
    assert "only with your consent (--trust)" in " ".join(text.split())
