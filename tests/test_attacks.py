"""Attacks by someone who prepares a folder or hands over runs: one test per class of attack.

Each test runs the CLI (or the API where a prompt would be answered) against a folder or a run
prepared as an attacker would, with a canary tree beside the run (a file, a folder of files, a
``*.tmp``): the canary must come out byte for byte as it went in, the answer must be a verdict
or one error line, and nothing may print a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from bisect_repro.capture.data import DataStream
from bisect_repro.capture.rng import RandomStreams
from bisect_repro.cli import app
from bisect_repro.diagnose.compare.compare import compare
from bisect_repro.errors import RecipeError
from bisect_repro.replay.deadline import (
    CEILING_S,
    FLOOR_S,
    SLOWER,
    Deadline,
    DeadlinePassed,
    allowance,
    guarded,
    step_seconds,
)
from bisect_repro.replay.launch import spec_for_run
from bisect_repro.store import codec
from bisect_repro.store.printable import html_text, printable
from bisect_repro.store.run import Run

runner = CliRunner()
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RECORD = ["--quiet", "--steps", "4", "--every", "1", "--checkpoint-every", "2"]
HIDDEN = ("Cc", "Cs", "Cf", "Zl", "Zp")


def tree(root: Path) -> dict[str, Any]:
    """Every name under ``root`` with what it is and holds; links are read, never followed."""
    found: dict[str, Any] = {}
    for folder, folders, names in os.walk(root):
        for name in folders + names:
            path = Path(folder) / name
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_dir():
                found[key] = ("folder",)
            else:
                found[key] = ("file", path.read_bytes())
    return found


@pytest.fixture
def canary(tmp_path: Path) -> Iterator[Path]:
    """A tree beside the run that no command may change."""
    outside = tmp_path / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "victim").write_text("the user's own file\n")
    (outside / "folder" / "data.txt").write_text("kept\n")
    (outside / "folder" / "half.tmp").write_text("kept too\n")
    (outside / "folder" / "step-00000003.st.zst").write_bytes(b"not a snapshot")
    before = tree(outside)
    yield outside
    assert tree(outside) == before, "a file outside the run was written, moved or deleted"


def cli(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    if result.exit_code == 2:
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two short runs of a recipe (checkpoints at 0, 2, 4), in ``a`` and ``b``, and the recipe in
    ``code``."""
    folder = tmp_path_factory.mktemp("attacks")
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
                *RECORD,
            ],
        )
        assert result.exit_code == 0, result.output
    return folder


def recipe(recorded: Path) -> str:
    return f"{recorded / 'code' / 'recipe.py'}:build"


def copy(recorded: Path, tmp_path: Path, name: str = "a", to: str = "run") -> Path:
    shutil.copytree(recorded / name, tmp_path / to)
    return tmp_path / to


# -- links in a folder someone prepared --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", [".lock", ".run.json.tmp"])
def test_a_link_in_a_prepared_folder_is_never_written_through(
    recorded, tmp_path, canary, name
) -> None:
    prepared = tmp_path / "D"
    prepared.mkdir()
    (prepared / name).symlink_to(canary / "victim")
    result = cli("record", recipe(recorded), "--out", str(prepared), *RECORD)
    assert result.exit_code in (0, 2), result.output


def test_force_never_writes_through_a_rank_folder_lock_that_is_a_link(
    recorded, tmp_path, canary
) -> None:
    run = copy(recorded, tmp_path)
    (run / "rank0" / ".lock").unlink(missing_ok=True)
    (run / "rank0" / ".lock").symlink_to(canary / "victim")
    result = cli("record", recipe(recorded), "--out", str(run), "--force", *RECORD)
    assert result.exit_code == 2 and "rank0/.lock" in result.stderr


# -- record --resume ---------------------------------------------------------------------------


def interrupted(run: Path, last: int) -> None:
    """The run as a recorder killed after step ``last`` leaves it: index lines past it gone, files
    left."""
    index = run / "rank0" / "index.jsonl"
    kept = [
        line
        for line in index.read_text().splitlines()
        if json.loads(line).get("kind") != "end" and json.loads(line)["step"] <= last
    ]
    index.write_text("".join(line + "\n" for line in kept))


@pytest.mark.parametrize("linked", ["snapshots", "superseded"])
def test_resume_moves_deletes_and_writes_nothing_outside_the_run(
    recorded, tmp_path, canary, linked
) -> None:
    run = copy(recorded, tmp_path)
    interrupted(run, 2)  # snapshots 3 and 4 are strays a resume moves to superseded/
    # the run's snapshots are elsewhere; the canary folder is linked in their place
    if linked == "snapshots":
        shutil.rmtree(run / "rank0" / "snapshots")
    (run / "rank0" / linked).symlink_to(canary / "folder")
    result = cli("record", recipe(recorded), "--out", str(run), "--resume", *RECORD)
    assert result.exit_code == 2 and f"rank0/{linked}" in result.stderr


# -- --force -----------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["empty meta", "beside run.json", "in snapshots"])
def test_force_removes_only_a_folder_it_proves_is_a_run(recorded, tmp_path, where) -> None:
    if where == "empty meta":
        folder = tmp_path / "P"
        folder.mkdir()
        (folder / "run.json").write_text("{}")
        own = folder / "thesis.tex"
    else:
        folder = copy(recorded, tmp_path, to="P")
        own = folder / ("notes.txt" if where == "beside run.json" else "rank0/snapshots/notes.txt")
    own.write_text("precious")
    before = tree(folder)
    result = cli("record", recipe(recorded), "--out", str(folder), "--force", *RECORD)
    assert result.exit_code == 2 and "nothing was removed" in result.stderr
    assert tree(folder) == before


# -- what is announced is what runs ------------------------------------------------------------


def unsigned(run: Path) -> None:
    meta = json.loads((run / "run.json").read_text())
    meta.pop("signature", None)
    (run / "run.json").write_text(json.dumps(meta))


@pytest.mark.slow
def test_a_recipe_swapped_after_its_hash_was_shown_never_runs(recorded, tmp_path) -> None:
    a, b = copy(recorded, tmp_path, "a", "a"), copy(recorded, tmp_path, "b", "b")
    for run in (a, b):
        unsigned(run)  # someone else's: compare asks before it replays
    source = recorded / "code" / "recipe.py"
    original = source.read_bytes()
    ran = tmp_path / "swapped-code-ran"
    shown: list[str] = []

    def consent(foreign: Any) -> bool:
        shown.extend(spec.sha256 for _, spec in foreign)
        # swapped while the user reads
        source.write_bytes(original + f"\nopen({str(ran)!r}, 'w').write('ran')\n".encode())
        return True

    try:
        result = compare(a, b, consent=consent)
    finally:
        source.write_bytes(original)
    assert shown and not ran.exists(), "the swapped code ran"
    assert any("changed after its SHA-256" in note for note in result.notes), result.notes


# -- consent covers what a replay restores -----------------------------------------------------


def edit_checkpoint(run: Path, step: int, change: Any) -> str:
    """Change a checkpoint's contents and its index line's size and checksum, as an attacker can."""
    name = f"checkpoints/step-{step:08d}.st.zst"
    tree_ = Run.open(run).checkpoint(step)
    change(tree_)
    data, raw = codec.encode(tree_)
    (run / "rank0" / name).write_bytes(data)
    index = run / "rank0" / "index.jsonl"
    lines = [json.loads(line) for line in index.read_text().splitlines()]
    for line in lines:
        if line.get("file") == name:
            line.update(bytes=len(data), raw_bytes=raw, checksum=codec.checksum(data))
    index.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return f"rank0/{name}"


@pytest.mark.parametrize("payload", ["data position", "module global"])
def test_an_edited_checkpoint_of_a_signed_run_is_edited_since(recorded, tmp_path, payload) -> None:
    run = copy(recorded, tmp_path)

    def change(state: dict[str, Any]) -> None:
        if payload == "data position":
            state["data"]["batch"] = 10**15
        else:
            state["python"]["globals"]["DRY_RUN"] = False

    edited = edit_checkpoint(run, 2, change)
    shown = json.loads(cli("show", str(run), "--json").stdout)
    assert not shown["recorded_by_you"] and shown["edited"] == [edited]
    assert edited in cli("show", str(run)).stdout
    assert not spec_for_run(Run.open(run)).signed  # a replay of it asks first


class Unsized:
    """A loader that does not say its length."""

    def __iter__(self) -> Iterator[list[int]]:
        return iter([[1], [2], [3]])


@pytest.mark.parametrize("loader", [[[1], [2], [3]], Unsized()], ids=["sized", "unsized"])
def test_a_recorded_data_position_past_the_dataset_is_refused_at_once(loader) -> None:
    stream = DataStream(loader, RandomStreams())
    stream.next_batch()
    state = {**stream.state_dict(), "batch": 10**15}
    with pytest.raises(RecipeError, match="recorded position"):
        stream.load_state_dict(state)


# -- loops bounded by what the run holds -------------------------------------------------------


def add_steps(run: Path, *steps: int, loss: Any = 1.0) -> None:
    with open(run / "rank0" / "steps.jsonl", "a") as log:
        for step in steps:
            log.write(json.dumps({"step": step, "loss": loss, "order": "x", "batch": "y"}) + "\n")


def run_cli(
    *args: str, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """The CLI in a process of its own (a loop that never ends is a timeout, not a hung suite)."""
    command = [sys.executable, "-c", "from bisect_repro.cli import main; main()", *args]
    found = subprocess.run(
        command, capture_output=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
    assert b"Traceback" not in found.stdout + found.stderr, found.stderr.decode(errors="replace")
    return found


@pytest.mark.slow
def test_step_numbers_from_a_run_drive_no_unbounded_loop(recorded, tmp_path) -> None:
    # equal records up to the last step
    a, b = copy(recorded, tmp_path, "a", "a"), copy(recorded, tmp_path, "a", "b")
    add_steps(a, 10**12)
    add_steps(b, 10**12, loss=2.0)
    found = run_cli("compare", str(a), str(b), "--no-replay", "--json", timeout=90)
    assert found.returncode in (0, 1), found.stderr


@pytest.mark.parametrize("line", [{"step": 10**400}, {"step": 1, "loss": 10**400}])
def test_a_number_past_any_float_is_refused_in_one_line(recorded, tmp_path, line) -> None:
    run = copy(recorded, tmp_path)
    with open(run / "rank0" / "steps.jsonl", "a") as log:
        log.write(json.dumps(line) + "\n")
    for command in (["show", str(run)], ["show", str(run), "--html", str(tmp_path / "r.html")]):
        assert cli(*command).exit_code == 2


# -- escaping ----------------------------------------------------------------------------------

HOSTILE = "\x1b[2K\x9b\udc9b\u200b\u200f\u061c\u2060\u2028"


def hostile_pair(recorded: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Two runs whose folder names hold the byte 0x9b and whose run.json holds every hidden
    character."""
    folder = Path(os.fsdecode(bytes(tmp_path) + b"/runs\x9b"))
    folder.mkdir()
    pair = copy(recorded, folder, "a", "a"), copy(recorded, folder, "b", "b")
    for run in pair:
        meta = json.loads((run / "run.json").read_text())
        meta["config"] = {"note": HOSTILE + run.name, HOSTILE: 1}
        (run / "run.json").write_text(json.dumps(meta))
    return pair


@pytest.mark.slow
def test_text_from_a_run_reaches_a_strict_terminal_escaped(recorded, tmp_path) -> None:
    a, b = hostile_pair(recorded, tmp_path)
    strict = {"PYTHONIOENCODING": "utf-8:strict", "COLUMNS": "400"}
    for command in (["show", str(a)], ["compare", str(a), str(b), "--no-replay"]):
        found = run_cli(*command, env=strict)
        assert found.returncode in (0, 1), found.stderr
        shown = (found.stdout + found.stderr).decode("utf-8")  # strict: every byte is UTF-8
        assert not [c for c in shown if unicodedata.category(c) in HIDDEN and c not in "\n"], shown
        assert "\\udc9b" in shown and "\\u200b" in shown


def test_html_reports_render_surrogates_and_hidden_characters_escaped(recorded, tmp_path) -> None:
    a, b = hostile_pair(recorded, tmp_path)
    for command in (["show", str(a)], ["compare", str(a), str(b), "--no-replay"]):
        page = tmp_path / "report.html"
        assert cli(*command, "--html", str(page)).exit_code in (0, 1)
        text = page.read_text(encoding="utf-8")  # strict: no surrogate was written
        assert "\\udc9b" in text and not [
            c for c in text if unicodedata.category(c) in HIDDEN and c not in "\n"
        ]


@given(
    st.text(
        st.characters(categories=["Cc", "Cs", "Cf", "Zl", "Zp", "Ll", "Lo", "Nd", "Zs"]), min_size=1
    )
)
def test_printable_leaves_no_hidden_character(text: str) -> None:
    for shown in (printable(text), html_text(text)):
        assert not [c for c in shown if unicodedata.category(c) in HIDDEN]
        shown.encode("utf-8")
    assert "<" not in html_text(text)


@given(st.binary())
def test_undecodable_bytes_are_shown_escaped(data: bytes) -> None:
    shown = printable(os.fsdecode(data.replace(b"\0", b"")))
    shown.encode("ascii", "ignore")
    assert not [c for c in shown if unicodedata.category(c) in HIDDEN]


# -- signing -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_record_warns_in_one_line_when_the_key_cannot_sign(recorded, tmp_path, monkeypatch) -> None:
    config = tmp_path / "config"
    (config / "bisect-repro").mkdir(parents=True)
    key = config / "bisect-repro" / "signing.key"
    key.write_text("00" * 32 + "\n")
    key.chmod(0o644)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config))
    result = cli("record", recipe(recorded), "--out", str(tmp_path / "r"), *RECORD)
    assert result.exit_code == 0
    warned = [line for line in result.stderr.splitlines() if "signing.key" in line]
    assert len(warned) == 1 and "chmod 600" in warned[0] and "unsigned" in warned[0]


# -- waits on a replaying process --------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_wait_on_a_replaying_process_ends_at_its_deadline() -> None:
    clock = Clock()
    seconds = allowance(0.5, 10)
    assert seconds == max(FLOOR_S, SLOWER * 0.5 * 10)
    deadline = Deadline("replay of A, 'skip'", seconds, 0.5, clock=clock)
    wait, progress = guarded(deadline, lambda: None, None)
    clock.now = seconds - 1
    wait()  # not yet
    progress(3)  # the process reports progress: the count starts again
    clock.now = 2 * seconds - 2
    wait()
    clock.now = 2 * seconds
    with pytest.raises(
        DeadlinePassed, match=r"replay of A, 'skip': no answer within \d+ s"
    ) as caught:
        wait()
    assert "\n" not in str(caught.value)


def test_the_recorded_step_time_bounds_the_allowance(recorded) -> None:
    seconds = step_seconds(Run.open(recorded / "a"))
    assert seconds is not None and seconds >= 0
    # a step count from a run cannot make a wait endless
    assert FLOOR_S <= allowance(seconds, 10**15) <= CEILING_S
