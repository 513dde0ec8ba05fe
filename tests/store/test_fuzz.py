"""Property-based tests of every reader against damaged run files.

Mutations (bit flips, truncation, splices of random bytes or of another run file, deleted and
repeated ranges) are applied to a copy of a small recorded run. Every reader must return the
recorded data or raise a :class:`BisectReproError`; nothing else may escape. Snapshots and
checkpoints are checksummed, so what they return must be exactly what was recorded; the logs are
not, so for them only the absence of any other exception is asserted (see ``store``'s docstring).

CI runs a bounded number of examples, derandomized. A longer, randomized session::

    BISECT_REPRO_FUZZ_EXAMPLES=5000 python -m pytest tests/test_fuzz.py -q
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_repro import RecordOptions, Run, record
from bisect_repro.errors import BisectReproError
from bisect_repro.record.recipe import build
from bisect_repro.store import codec

LONG = int(os.environ.get("BISECT_REPRO_FUZZ_EXAMPLES", "0"))
FUZZ = settings(
    max_examples=LONG or 60,
    derandomize=not LONG,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _record() -> Path:
    root = Path(tempfile.mkdtemp(prefix="bisect-repro-fuzz-"))
    examples = Path(__file__).resolve().parents[2] / "examples"
    trainee = build(f"{examples / 'mlp.py'}:build", {"hidden": 4, "batch_size": 8})
    return record(trainee, root / "run", RecordOptions(steps=4, every=2, checkpoint_every=2))


RUN = _record()
FILES = sorted(str(p.relative_to(RUN)) for p in RUN.rglob("*") if p.is_file() and p.name != ".lock")
CONTENT = {name: (RUN / name).read_bytes() for name in FILES}
REFERENCE = Run.open(RUN)
SNAPSHOTS = {step: REFERENCE.snapshot(step) for step in REFERENCE.snapshots}
CHECKPOINTS = {step: REFERENCE.checkpoint(step) for step in REFERENCE.checkpoints}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return (
            type(a) is type(b)
            and len(a) == len(b)
            and all(same(x, y) for x, y in zip(a, b, strict=True))
        )
    return type(a) is type(b) and (a == b or (a != a and b != b))  # NaN equals NaN here


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with one to three mutations."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 3))):
        size = len(out)
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "splice", "delete", "repeat"]))
        at = draw(st.integers(0, max(size - 1, 0)))
        if kind == "flip" and size:
            out[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del out[at:]
        elif kind == "insert":
            out[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "splice":  # a piece of another run file, as a misdirected write would leave
            other = CONTENT[draw(st.sampled_from(FILES))]
            start = draw(st.integers(0, max(len(other) - 1, 0)))
            out[at:at] = other[start : start + draw(st.integers(1, 256))]
        elif kind == "delete":
            del out[at : at + draw(st.integers(1, 64))]
        elif kind == "repeat":
            out[at:at] = out[at : at + draw(st.integers(1, 64))]
    return bytes(out)


def read_everything(path: Path) -> None:
    """Every reader on a run; what snapshots and checkpoints return must be what was recorded."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torn lines are reported by warnings, which is allowed
        run = Run.open(path)
    assert set(run.snapshots) <= set(SNAPSHOTS) and set(run.checkpoints) <= set(CHECKPOINTS)
    for step in run.snapshots:
        with contextlib.suppress(BisectReproError):
            assert same(run.snapshot(step), SNAPSHOTS[step]), (
                f"snapshot {step} read back different data"
            )
    for step in run.checkpoints:
        with contextlib.suppress(BisectReproError):
            assert same(run.checkpoint(step), CHECKPOINTS[step]), (
                f"checkpoint {step} read back different data"
            )
    run.losses()


@pytest.mark.parametrize("name", FILES)
def test_every_reader_returns_the_recorded_data_or_a_project_error(name: str) -> None:
    @FUZZ
    @given(damaged=mutated(CONTENT[name]))
    def check(damaged: bytes) -> None:
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / "run"
            shutil.copytree(RUN, copy)
            (copy / name).write_bytes(damaged)
            try:
                read_everything(copy)
            except BisectReproError as error:
                assert "\n" not in str(error)

    check()


ENTRY = next(iter(REFERENCE.checkpoints.values()))
BLOB = CONTENT[f"rank0/{ENTRY.file}"]
RAW = zstandard.ZstdDecompressor().decompress(BLOB)


@FUZZ
@given(damaged=mutated(BLOB))
def test_decode_with_the_index_checks_returns_the_data_or_a_project_error(damaged: bytes) -> None:
    try:
        tree = codec.decode(damaged, Path("f"), raw_size=ENTRY.raw_bytes, digest=ENTRY.checksum)
    except BisectReproError:
        return
    assert same(tree, CHECKPOINTS[ENTRY.step])


@FUZZ
@given(damaged=mutated(RAW))
def test_decode_of_damaged_safetensors_raises_only_project_errors(damaged: bytes) -> None:
    """Behind the checksum: a crafted file whose index agrees with it reaches the safetensors
    checks."""
    data = zstandard.ZstdCompressor().compress(damaged)
    try:
        codec.decode(data, Path("f"), raw_size=len(damaged), digest=codec.checksum(data))
    except BisectReproError as error:
        assert "\n" not in str(error)


@FUZZ
@given(damaged=mutated(BLOB), declared=st.integers(0, 1 << 40))
def test_decode_without_a_checksum_raises_only_project_errors(
    damaged: bytes, declared: int
) -> None:
    for raw_size in (declared, len(RAW)):
        try:
            codec.decode(damaged, Path("f"), raw_size=raw_size)
        except BisectReproError as error:
            assert "\n" not in str(error)


def teardown_module() -> None:
    shutil.rmtree(RUN.parent, ignore_errors=True)
