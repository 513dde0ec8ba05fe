"""Run directories as hostile input, through the command line: every attack is one line naming the
file and exit code 2, in bounded time and memory.

Each case plants one attack in a copy of a small run written by :class:`RunWriter` (no training):
FIFOs, symbolic links out of the run, JSON bombs in a snapshot's safetensors header and skeleton,
in ``run.json`` and in the logs, integer overflow in a tensor's shape, and strings made to drive
the terminal. The FIFO cases run under ``signal.alarm``: a reader that blocks fails, never hangs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import tracemalloc
from collections.abc import Callable, Iterator
from io import StringIO
from pathlib import Path

import pytest
import torch
import zstandard
from rich.console import Console
from typer.testing import CliRunner

from bisect_repro import cli
from bisect_repro.cli import app
from bisect_repro.diagnose.compare.compare import compare
from bisect_repro.report.safe import safe_text
from bisect_repro.report.text import render_comparison
from bisect_repro.store import codec
from bisect_repro.store.writer import RunWriter

runner = CliRunner()
LAST = "rank0/snapshots/step-00000006.st.zst"  # the snapshot `show` reads
CHECKPOINT = "rank0/checkpoints/step-00000000.st.zst"
MODEL = {"parameters": {"w": [[2], "float32"]}, "buffers": {}}
MB = 1 << 20


def write_run(
    path: Path,
    hashes: dict[int, str],
    *,
    model: dict = MODEL,
    target: str | None = None,
    config: dict | None = None,
    streams: dict | None = None,
) -> Path:
    """A finished single-process run: a snapshot per entry of ``hashes``, a checkpoint at the
    first."""
    writer = RunWriter.create(
        path, {"target": target, "config": config or {}, "model": model, "environment": {}}
    )
    for step in range(max(hashes) + 1):
        writer.append_steps([{"step": step, "loss": 1.0, "order": "o", "batch": "b"}])
    for number, (step, digest) in enumerate(sorted(hashes.items())):
        tree = {
            "step": step,
            "hashes": {"w": digest},
            "streams": streams or {"torch": {"state": torch.arange(4)}},
            "data": {},
        }
        writer.commit("snapshot", step, tree)
        if number == 0:
            writer.commit("checkpoint", step, {"model": {"w": torch.zeros(2)}})
    writer.finish(max(hashes))
    writer.close()
    return path


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    return write_run(tmp_path_factory.mktemp("pristine") / "run", {0: "a", 2: "b", 4: "c", 6: "d"})


@pytest.fixture
def run(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "run"))


@pytest.fixture
def other(pristine, tmp_path) -> Path:
    """An identical run beside it: what a link points to, and the second run of ``compare``."""
    return Path(shutil.copytree(pristine, tmp_path / "other"))


@pytest.fixture
def no_hang() -> Iterator[None]:
    def expire(*_: object) -> None:
        raise TimeoutError("the reader blocked")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def wide_output(monkeypatch) -> None:
    """The CLI's reports 200 columns wide, whatever ``COLUMNS`` was when the CLI was imported (its
    console reads it then: a machine that sets ``COLUMNS=80`` cut these tables)."""
    monkeypatch.setattr(cli, "stdout", Console(width=200))


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


COMMANDS: dict[str, Callable[[Path, Path], list[object]]] = {
    "show": lambda run, other: ["show", run],
    "show --verify": lambda run, other: ["show", run, "--verify"],
    "compare": lambda run, other: ["compare", run, other, "--no-replay"],
}


def assert_refused(result, named: Path, words: str) -> None:
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in result.output, message
    assert message.startswith("error: ") and str(named) in message and words in message, message


def peak_memory(call: Callable[[], object]) -> int:
    """The most memory Python held during ``call``, over what it held before (every bytes, str and
    JSON object)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


# --- 1. FIFOs: refused by fstat before a byte is read, never waited on -------------------------


def reading(names: list[str], checkpoints: str) -> list[tuple[str, str]]:
    """Each name with each command that reads it: ``checkpoints`` with ``show --verify`` alone (only
    it reads every checkpoint)."""
    return [
        (name, command)
        for name in names
        for command in COMMANDS
        if name != checkpoints or command == "show --verify"
    ]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize(
    ("name", "command"),
    reading(["run.json", "rank0/steps.jsonl", "rank0/index.jsonl", LAST, CHECKPOINT], CHECKPOINT),
)
def test_a_fifo_in_a_run_is_refused_at_once(run, other, no_hang, name, command) -> None:
    (run / name).unlink()
    os.mkfifo(run / name)
    assert_refused(invoke(*COMMANDS[command](run, other)), run / name, "not a regular file")


# --- 2. symbolic links: nothing inside a run is followed -------------------------------------

LINKED = [
    "run.json",
    "rank0",
    "rank0/snapshots",
    "rank0/checkpoints",
    "rank0/steps.jsonl",
    "rank0/index.jsonl",
    LAST,
]


@pytest.mark.parametrize(("name", "command"), reading(LINKED, "rank0/checkpoints"))
def test_a_link_to_another_run_is_refused(run, other, name, command) -> None:
    target = other / name
    shutil.rmtree(run / name) if (run / name).is_dir() else (run / name).unlink()
    (run / name).symlink_to(target, target_is_directory=target.is_dir())
    assert_refused(invoke(*COMMANDS[command](run, other)), run / name, "is a symbolic link")


def test_a_dangling_link_is_refused_as_a_link(run) -> None:
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(run / "nowhere.json")
    assert_refused(invoke("show", run), run / "run.json", "is a symbolic link")


def test_the_run_directory_itself_may_be_a_link(run, tmp_path) -> None:
    (tmp_path / "link").symlink_to(run, target_is_directory=True)
    result = invoke("show", tmp_path / "link", "--verify")
    assert result.exit_code == 0, result.output


# --- 3. JSON bombs: refused before they are parsed, in bounded memory --------------------------


def index_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rank0" / "index.jsonl").read_text().splitlines()]


def plant_snapshot(run: Path, data: bytes, raw_size: int, **declared: int) -> None:
    """``data`` in place of the last snapshot, with an index line that agrees with it (a crafted
    file)."""
    (run / LAST).write_bytes(data)
    lines = index_lines(run)
    for line in lines:
        if line.get("file") == LAST.removeprefix("rank0/"):
            line.update(
                bytes=len(data), raw_bytes=raw_size, checksum=codec.checksum(data), **declared
            )
    (run / "rank0" / "index.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def safetensors_frame(
    header_parts: list[tuple[bytes, int]], data: bytes = b""
) -> tuple[bytes, int]:
    """A zstandard frame of a safetensors file whose header is ``part * count`` for each part, never
    held whole: a header of a hundred megabytes costs the test a few kilobytes."""
    length = sum(len(part) * count for part, count in header_parts)
    size = 8 + length + len(data)
    compressor = zstandard.ZstdCompressor(level=3).compressobj(size=size)
    out = [compressor.compress(struct.pack("<Q", length))]
    for part, count in header_parts:
        per_chunk = max(1, MB // len(part))
        while count > 0:
            out.append(compressor.compress(part * min(count, per_chunk)))
            count -= per_chunk
    out.append(compressor.compress(data))
    out.append(compressor.flush())
    return b"".join(out), size


def skeleton_bomb(nodes: int, data: bytes = b"") -> tuple[bytes, int]:
    """A header whose ``__metadata__`` skeleton holds ``nodes`` empty objects: ``{"hashes": {}, "x":
    [{}, {}, ...]}``."""
    return safetensors_frame(
        [
            (b'{"__metadata__":{"bisect_repro":"{\\"hashes\\":{},\\"x\\":[', 1),
            (b"{},", nodes),
            (b'{}]}"}}', 1),
        ],
        data,
    )


def shape_bomb(dimensions: int) -> tuple[bytes, int]:
    """A header with one tensor of ``dimensions`` dimensions of size 1."""
    head = b'{"__metadata__":{"bisect_repro":"{}"},"a":{"dtype":"U8","data_offsets":[0,1],"shape":['
    return safetensors_frame([(head, 1), (b"1,", dimensions), (b"1]}}", 1)], b"\0")


BOMBS = {
    # the attack as shown: 9 KB on disk, a 99 MB skeleton (gigabytes and a minute to parse without
    # the caps)
    "99 MB skeleton": (lambda: skeleton_bomb(33_000_000), "more than a real one"),
    "60 MB shape": (lambda: shape_bomb(30_000_000), "more than a real one"),
    # 1 MiB of noise shipped lifts the header's length cap to 65 MB: the count of values still
    # refuses it
    "26 million values": (
        lambda: skeleton_bomb(13_000_000, os.urandom(MB)),
        "JSON values, more than",
    ),
}


@pytest.mark.parametrize("bomb", BOMBS)
def test_a_header_bomb_is_refused_in_bounded_memory(run, bomb) -> None:
    make, words = BOMBS[bomb]
    data, size = make()
    assert len(data) < 2 * MB and size > 30 * MB
    plant_snapshot(run, data, size)
    result = None

    def show() -> None:
        nonlocal result
        result = invoke("show", run)

    assert peak_memory(show) < 300 * MB
    assert_refused(result, run / LAST, words)


def test_a_run_json_bomb_is_refused_before_parsing(run) -> None:
    # 4.5 MB, 3 million values
    (run / "run.json").write_bytes(b'{"format": 1, "x": [' + b"[]," * (1_500_000) + b"[]]}")
    assert_refused(invoke("show", run), run / "run.json", "JSON values, more than 2,000,000")
    (run / "run.json").write_bytes(b'{"format": 1, "x": "' + b"x" * (17 * MB) + b'"}')
    assert_refused(invoke("show", run), run / "run.json", "more than run metadata can be")


def test_a_log_line_bomb_is_refused(run) -> None:
    steps = run / "rank0" / "steps.jsonl"
    # 300 KB, 200,000 values
    steps.write_bytes(b'{"step": 0, "x": [' + b"[]," * 100_000 + b"[]]}\n")
    assert_refused(invoke("show", run), steps, "line 1 holds more than 65,536 JSON values")
    os.truncate(steps, 0)
    # a sparse file: one line of 200 MB of NUL, read a megabyte at most
    os.truncate(steps, 200 * MB)
    result = None

    def show() -> None:
        nonlocal result
        result = invoke("show", run)

    assert peak_memory(show) < 16 * MB
    assert_refused(result, steps, "line 1 is longer than 1048576 bytes")


# --- 4. integers: exact, never wrapped ---------------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        # int64 product: 2**64 wraps to 0
        {"dtype": "F32", "shape": [2**32, 2**32], "data_offsets": [0, 0]},
        {"dtype": "F32", "shape": [2**62, 4], "data_offsets": [0, 0]},  # 2**64 elements again
        # a boolean is not a dimension
        {"dtype": "F32", "shape": [True, 2], "data_offsets": [0, 8]},
        {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]},  # nor a float an offset
        {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 16]},
        {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]},
    ],
    ids=[
        "2^32 x 2^32",
        "2^62 x 4",
        "bool dimension",
        "float offsets",
        "three offsets",
        "dtype a list",
    ],
)
def test_a_shape_or_offset_that_is_not_an_exact_count_is_refused(run, entry) -> None:
    header = json.dumps(
        {
            "__metadata__": {"bisect_repro": json.dumps({"hashes": {}, "a": {"__tensor__": "a"}})},
            "a": entry,
        }
    ).encode()
    raw = struct.pack("<Q", len(header)) + header + bytes(8)
    plant_snapshot(run, zstandard.ZstdCompressor().compress(raw), len(raw))
    assert_refused(
        invoke("show", run), run / LAST, "safetensors entry 'a' has a bad dtype, shape or offsets"
    )


# --- 5. nothing is read past what the index declares -------------------------------------------


def test_a_declared_size_past_memory_is_refused_before_reading(run) -> None:
    plant_snapshot(run, (run / LAST).read_bytes(), 0)
    lines = index_lines(run)
    lines[-2].update(bytes=10**15)  # the last snapshot's line, before "end"
    (run / "rank0" / "index.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert lines[-2]["file"] == LAST.removeprefix("rank0/")
    assert_refused(invoke("show", run), run / LAST, "more than this machine's memory")


def test_a_file_larger_than_declared_is_refused_by_its_size_alone(run) -> None:
    os.truncate(run / LAST, 50 * 2**30)  # 50 GiB, sparse: never read
    result = None

    def show() -> None:
        nonlocal result
        result = invoke("show", run)

    assert peak_memory(show) < 16 * MB
    assert_refused(result, run / LAST, f"{50 * 2**30} bytes, the run index declares")


# --- 6, 7. the text report: other model structures, long timelines, strings from a run -----------


def test_runs_of_different_model_structures_render(tmp_path) -> None:
    a = write_run(tmp_path / "a", {0: "x", 2: "y"})
    b = write_run(
        tmp_path / "b",
        {0: "x", 2: "y"},
        model={"parameters": {"w": [[2], "float32"], "v": [[3], "float32"]}, "buffers": {}},
    )
    console = Console(file=StringIO(), width=200)
    render_comparison(compare(a, b, replay=False), console)
    text = console.file.getvalue()
    assert (
        "The runs diverge" in text
        and "the model structure" in text
        and "v is absent in run A" in text
    )
    assert "no snapshots compared" in text
    result = invoke("compare", a, b, "--no-replay")
    assert result.exit_code == 1 and "no snapshots compared" in result.stdout, result.output


def test_a_long_timeline_says_where_it_leaves_rows_out(tmp_path) -> None:
    a = write_run(tmp_path / "a", {step: "same" for step in range(30)})
    b = write_run(tmp_path / "b", {step: "same" if step < 20 else "other" for step in range(30)})
    result = invoke("compare", a, b, "--no-replay")
    assert result.exit_code == 1, result.output
    assert (
        "… 15 snapshots not shown …" in result.stdout
        and "… 5 snapshots not shown …" in result.stdout
    )
    shown = [
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.startswith("│") and line.split()[1].isdigit()
    ]
    assert shown == ["0", *map(str, range(16, 24)), "29"]


EVIL = "[red]evil[/red]\x1b[2J\x9b1m\u202e"


def test_strings_from_a_run_are_printed_as_text(tmp_path) -> None:
    streams = {f"s{EVIL}": {"state": torch.arange(2)}}
    a = write_run(
        tmp_path / "a",
        {0: "x"},
        target=f"t{EVIL}",
        config={f"k{EVIL}": f"v{EVIL}"},
        streams=streams,
    )
    b = write_run(
        tmp_path / "b", {0: "x"}, target=f"t{EVIL}", config={f"k{EVIL}": "other"}, streams=streams
    )
    for result in (invoke("show", a), invoke("compare", a, b, "--no-replay")):
        assert result.exit_code in (0, 1), result.output
        output = result.stdout
        assert (
            "[red]evil[/red]" in output
            and "\\x1b[2J" in output
            and "\\x9b" in output
            and "\\u202e" in output
        ), output
        assert not any(c in output for c in "\x1b\x9b\u202e"), output


def test_safe_text_escapes_markup_and_control_characters() -> None:
    plain = Console(file=StringIO(), width=200, highlight=False)
    plain.print(f"[bold]{safe_text(EVIL)}[/] [dim]{safe_text('a backslash ' + chr(92))}[/]")
    assert plain.file.getvalue() == "[red]evil[/red]\\x1b[2J\\x9b1m\\u202e a backslash \\\n"
    styled = Console(file=StringIO(), width=200, force_terminal=True)
    styled.print(f"[bold]{safe_text(EVIL)}[/]")
    # rich's own styles only
    assert "\x1b[2J" not in styled.file.getvalue() and "\x9b" not in styled.file.getvalue()
