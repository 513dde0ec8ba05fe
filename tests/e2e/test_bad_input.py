"""Bad runs through the command line: one line naming the file and the problem, exit code 2.

Each case damages a copy of one small recorded run. Damage inside a snapshot that keeps the index
consistent (size and checksum rewritten) stands for a file crafted on purpose; it reaches the
zstandard and safetensors checks behind the checksum.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import zstandard
from typer.testing import CliRunner

from bisect_repro import RecordOptions, record
from bisect_repro.cli import app
from bisect_repro.record.recipe import build
from bisect_repro.store import codec

runner = CliRunner()
LAST = "rank0/snapshots/step-00000006.st.zst"  # the snapshot show reads: the last


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    examples = Path(__file__).resolve().parent.parent.parent / "examples"
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 8})
    return record(
        trainee,
        tmp_path_factory.mktemp("good") / "run",
        RecordOptions(steps=6, every=2, checkpoint_every=4),
    )


def index_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rank0" / "index.jsonl").read_text().splitlines()]


def write_index(run: Path, lines: list[dict]) -> None:
    (run / "rank0" / "index.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def replace_first_snapshot(run: Path, data: bytes, raw_size: int) -> None:
    """Put ``data`` in place of the first snapshot with an index line that agrees with it."""
    (run / LAST).write_bytes(data)
    lines = index_lines(run)
    for line in lines:
        if line.get("file") == LAST.removeprefix("rank0/"):
            line.update(bytes=len(data), raw_bytes=raw_size, checksum=codec.checksum(data))
    write_index(run, lines)


def raw_first(run: Path) -> bytes:
    return zstandard.ZstdDecompressor().decompress((run / LAST).read_bytes())


def repack(run: Path, raw: bytes, **compressor: bool) -> None:
    replace_first_snapshot(run, zstandard.ZstdCompressor(**compressor).compress(raw), len(raw))


def safetensors_bytes(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def flip(path: Path, where: float) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * where)] ^= 0xFF
    path.write_bytes(bytes(data))


def truncated_frame(run: Path) -> None:
    data = (run / LAST).read_bytes()
    replace_first_snapshot(run, data[: len(data) // 2], len(raw_first(run)))


def header_with_flipped_bytes(run: Path) -> None:
    raw = bytearray(raw_first(run))
    for offset in (9, 10, 11):
        raw[offset] ^= 0x5A
    repack(run, bytes(raw))


def header_longer_than_file(run: Path) -> None:
    raw = raw_first(run)
    repack(run, struct.pack("<Q", len(raw) * 4) + raw[8:])


def overlapping_offsets(run: Path) -> None:
    header = {
        "__metadata__": {
            "bisect_repro": json.dumps({"a": {"__tensor__": "a"}, "b": {"__tensor__": "b"}})
        },
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    repack(run, safetensors_bytes(header, bytes(12)))


def not_a_dtype(run: Path) -> None:
    header = {
        "__metadata__": {"bisect_repro": json.dumps({"hashes": {}, "x": {"__dtype__": "load"}})}
    }
    repack(run, safetensors_bytes(header, b""))


def bomb(run: Path) -> None:
    """64 MiB of zeros in 2 KiB, the index still declaring the snapshot's own size."""
    declared = len(raw_first(run))
    data = zstandard.ZstdCompressor(level=19).compress(bytes(64 << 20))
    replace_first_snapshot(run, data, declared)


def bomb_without_declared_size(run: Path) -> None:
    raw = raw_first(run)
    repack(run, raw, write_content_size=False)


def torn(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        with open(run / "rank0" / name, "ab") as handle:
            handle.write(b'{"step": 6, "lo')

    return damage


def edit_json(name: str, change: Callable[[dict], object]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        path = run / name
        value = json.loads(path.read_text())
        path.write_text(json.dumps(change(value)))

    return damage


def edit_index(change: Callable[[list[dict]], None]) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        lines = index_lines(run)
        change(lines)
        write_index(run, lines)

    return damage


def symlink_to_zero(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / name).unlink()
        os.symlink("/dev/zero", run / name)

    return damage


# (case, damage, file named in the message, words in the message)
CASES: list[tuple[str, Callable[[Path], object], str, str]] = [
    ("missing path", lambda run: shutil.rmtree(run), "", "no such run directory"),
    ("not a run", lambda run: (run / "run.json").unlink(), "", "not a bisect-repro run"),
    (
        "format 0",
        edit_json("run.json", lambda m: {**m, "format": 0}),
        "run.json",
        "unknown format version 0",
    ),
    (
        "format 3",
        edit_json("run.json", lambda m: {**m, "format": 3}),
        "run.json",
        "format 3 is newer than this bisect-repro reads",
    ),
    (
        "format 2 alone",
        edit_json("run.json", lambda m: {**m, "format": 2}),
        "run.json",
        "format 2 without 'distributed'",
    ),
    (
        "format a string",
        edit_json("run.json", lambda m: {**m, "format": "1"}),
        "run.json",
        "no format version",
    ),
    (
        "run.json garbage",
        lambda run: (run / "run.json").write_bytes(b"\x00\xffgarbage"),
        "run.json",
        "not valid JSON",
    ),
    (
        "run.json truncated",
        lambda run: (run / "run.json").write_text((run / "run.json").read_text()[:50]),
        "run.json",
        "not valid JSON",
    ),
    (
        "run.json nested",
        lambda run: (run / "run.json").write_text("[" * 100_000),
        "run.json",
        "not valid JSON",
    ),
    (
        "run.json a list",
        lambda run: (run / "run.json").write_text("[1]"),
        "run.json",
        "no format version",
    ),
    (
        "run.json wrong shape",
        edit_json("run.json", lambda m: {**m, "model": [1]}),
        "run.json",
        "'model' is a list",
    ),
    (
        "garbage mid step log",
        lambda run: (run / "rank0/steps.jsonl").write_text('{"step": 0}\nxx\n{"step": 1}\n'),
        "rank0/steps.jsonl",
        "line 2",
    ),
    (
        "bad step number",
        lambda run: (run / "rank0/steps.jsonl").write_text('{"step": -3}\n'),
        "rank0/steps.jsonl",
        "bad fields",
    ),
    (
        "index bad field",
        edit_index(lambda lines: lines[0].update(step="zero")),
        "rank0/index.jsonl",
        "bad fields",
    ),
    (
        "index path escape",
        edit_index(lambda lines: lines[0].update(file="../../run.json")),
        "rank0/index.jsonl",
        "is not the name of a snapshot",
    ),
    (
        "index unknown kind",
        edit_index(lambda lines: lines[0].update(kind="model")),
        "rank0/index.jsonl",
        "unknown kind",
    ),
    (
        "step log is /dev/zero",
        symlink_to_zero("rank0/steps.jsonl"),
        "rank0/steps.jsonl",
        "not a regular file",
    ),
    ("snapshot is /dev/zero", symlink_to_zero(LAST), LAST, "not a regular file"),
    ("snapshot missing", lambda run: (run / LAST).unlink(), LAST, "is in the index but missing"),
    (
        "snapshot cut short",
        lambda run: (run / LAST).write_bytes((run / LAST).read_bytes()[:100]),
        LAST,
        "the run index declares",
    ),
    ("snapshot bit flip", lambda run: flip(run / LAST, 0.5), LAST, "checksum does not match"),
    ("truncated zstandard frame", truncated_frame, LAST, "truncated or corrupt zstandard frame"),
    (
        "safetensors header flipped",
        header_with_flipped_bytes,
        LAST,
        "safetensors header is not valid JSON",
    ),
    ("header length past the end", header_longer_than_file, LAST, "exceeds the file"),
    ("overlapping offsets", overlapping_offsets, LAST, "overlap"),
    ("a dtype that is not one", not_a_dtype, LAST, "'load' is not a torch dtype"),
    ("decompression bomb", bomb, LAST, "zstandard frame declares 67108864 bytes, the run index"),
    (
        "frame without its size",
        bomb_without_declared_size,
        LAST,
        "zstandard frame declares -1 bytes",
    ),
]


@pytest.mark.parametrize(
    "damage, named, expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_a_bad_run_is_one_line_naming_the_file_and_exit_2(
    recorded, tmp_path, damage, named, expected
) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded, run, symlinks=True)
    damage(run)
    result = runner.invoke(app, ["show", str(run)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and "Traceback" not in result.output, message
    assert (
        message.startswith("error: ")
        and f"{run / named}".rstrip("/") in message
        and expected in message
    ), message


def test_a_declared_size_beyond_memory_is_refused_before_decompressing(
    recorded, tmp_path, monkeypatch
) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    monkeypatch.setattr(codec, "_memory_cap", lambda: 1000)
    result = runner.invoke(app, ["show", str(run)])
    assert (
        result.exit_code == 2
        and "more than this machine's memory" in result.stderr
        and str(run / LAST) in result.stderr
    )


@pytest.mark.parametrize("log", ["steps.jsonl", "index.jsonl"])
def test_a_torn_last_line_is_skipped_with_a_warning(recorded, tmp_path, log) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    torn(log)(run)
    result = runner.invoke(app, ["show", str(run), "--json"])
    assert result.exit_code == 0, result.output
    warning = [line for line in result.stderr.splitlines() if "is torn" in line]
    assert len(warning) == 1 and re.search(rf"warning: .*{log}: line \d+ is torn", warning[0]), (
        result.stderr
    )
    summary = json.loads(result.stdout)
    assert summary["snapshots"] == [0, 2, 4, 6] and summary["steps_logged"] == 6


def test_show_of_a_run_cut_after_a_commit_reports_its_last_complete_step(
    recorded, tmp_path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(recorded, run)
    lines = (run / "rank0" / "index.jsonl").read_text().splitlines(keepends=True)
    (run / "rank0" / "index.jsonl").write_text(
        "".join(line for line in lines if '"step": 6' not in line and "end" not in line)
    )
    result = runner.invoke(app, ["show", str(run)])
    assert result.exit_code == 0 and "incomplete (last complete step 4)" in " ".join(
        result.stdout.split()
    )
