"""The fused Triton kernel of the hash, checked without a GPU by Triton's interpreter.

Triton decides at import whether it interprets, so the checks run in a child pytest with
``TRITON_INTERPRET=1`` and ``BISECT_REPRO_HASH_BACKEND=triton``: there every hash of
tests/test_hashing.py, and the properties below, go through the kernel on CPU tensors. On a
CUDA machine the properties also run on the GPU in this process; elsewhere they carry the ``cuda``
mark here, so that outside the interpreted run they are skipped as GPU tests.

Triton is not a dependency (CUDA builds of torch bring it; ``.ci/run`` installs the release
``constraints.txt`` pins): without it the module is skipped on a developer's machine and fails in
CI (see tests/required.py).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_repro.capture import _hash_torch, hashing
from bisect_repro.capture.hashing import hash_tensor, hash_tensors

from ..required import missing

if importlib.util.find_spec("triton") is None:
    missing("triton", "pip install -c constraints.txt triton", module_level=True)

from bisect_repro.capture import _hash_triton

from .test_hashing import examples, fast_reference, fast_reference_lanes, tensors

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
ROOT = Path(__file__).resolve().parents[2]


KERNEL_TESTS: list[str] = []


def on_the_kernel_device(test: Callable[..., None]) -> Callable[..., None]:
    """A property of the kernel: run on the CPU in the interpreted run, a ``cuda`` test in any
    other."""
    KERNEL_TESTS.append(test.__name__)
    return test if INTERPRETING else pytest.mark.cuda(test)


def kernel_device() -> str:
    return "cpu" if INTERPRETING else "cuda"


@pytest.mark.slow
def test_the_kernel_runs_every_hash_test_under_the_interpreter() -> None:
    if INTERPRETING:
        pytest.skip("already inside the interpreted run")
    env = {**os.environ, "TRITON_INTERPRET": "1", "BISECT_REPRO_HASH_BACKEND": "triton"}
    tests = [
        str(ROOT / "tests" / "capture" / "test_hashing.py"),
        str(ROOT / "tests" / "capture" / "test_hash_triton.py"),
    ]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rA",
            "-p",
            "no:cacheprovider",
            "-m",
            "not cuda",
            *tests,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout
    ran = {
        line.split("::")[-1]
        for line in done.stdout.splitlines()
        if line.startswith("PASSED tests/capture/test_hash_triton.py::")
    }
    # every property of the kernel ran in the child, none skipped
    assert ran == set(KERNEL_TESTS), done.stdout[-4000:]


@on_the_kernel_device
def test_the_interpreted_run_really_uses_the_kernel() -> None:
    device = kernel_device()
    calls: list[int] = []
    real = _hash_triton.lanes

    def spy(words: list[torch.Tensor]) -> torch.Tensor:
        calls.append(len(words))
        return real(words)

    with mock.patch.object(_hash_triton, "lanes", spy):
        hash_tensors({"a": torch.randn(10, device=device), "b": torch.randn(70_000, device=device)})
    assert calls == [2]  # every tensor of the call in one launch


# Small blocks so that small tensors cross block boundaries and take both loops of the kernel.
BLOCKS = st.sampled_from(
    [(32, 1), (32, 4), (64, 2), (_hash_triton._VECTOR, _hash_triton._ITERATIONS)]
)


@on_the_kernel_device
@settings(max_examples=examples(40), deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=6), BLOCKS)
def test_kernel_lanes_match_the_definition(
    batch: list[torch.Tensor], block: tuple[int, int]
) -> None:
    device = kernel_device()
    vector, iterations = block
    words = [_hash_torch.words_of(t.to(device)) for t in batch]
    with mock.patch.multiple(
        _hash_triton, _VECTOR=vector, _ITERATIONS=iterations, _BLOCK_WORDS=vector * iterations
    ):
        found = (_hash_triton.lanes(words).cpu().to(torch.int64) & 0xFFFFFFFF).tolist()
    assert found == [list(fast_reference_lanes(t)) for t in batch]


@on_the_kernel_device
@settings(max_examples=examples(20), deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=4))
def test_kernel_digests_match_the_torch_op_path(batch: list[torch.Tensor]) -> None:
    device = kernel_device()
    named = {f"t{i}": t.to(device) for i, t in enumerate(batch)}
    assert hash_tensors(named) == {
        name: fast_reference(t) for name, t in zip(named, batch, strict=True)
    }
    with mock.patch.object(hashing, "_BACKEND", "torch"):
        assert hash_tensors(named) == {
            name: fast_reference(t) for name, t in zip(named, batch, strict=True)
        }


@on_the_kernel_device
def test_kernel_handles_full_and_partial_blocks_at_the_real_size() -> None:
    device = kernel_device()
    block = _hash_triton._BLOCK_WORDS
    generator = torch.Generator().manual_seed(5)
    for words in (block - 1, block, block + 1, 3 * block + 7):
        tensor = torch.randint(
            -(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=generator
        )
        assert hash_tensor(tensor.to(device)) == fast_reference(tensor)


@on_the_kernel_device
def test_tables_are_cached_per_layout() -> None:
    device = kernel_device()
    words = [
        torch.zeros(100, dtype=torch.int32, device=device),
        torch.zeros(5, dtype=torch.int32, device=device),
    ]
    first, _ = _hash_triton._table(words, torch.device(device))
    again, _ = _hash_triton._table(words, torch.device(device))
    assert first is again
    with mock.patch.multiple(_hash_triton, _VECTOR=32, _ITERATIONS=1, _BLOCK_WORDS=32):
        smaller, programs = _hash_triton._table(words, torch.device(device))
    assert smaller is not first and programs == 4 + 1


@on_the_kernel_device
def test_views_off_a_16_byte_boundary_take_a_short_head_block() -> None:
    # Views into a flat buffer start anywhere: the kernel must not assume aligned full blocks there.
    device = kernel_device()
    block = _hash_triton._BLOCK_WORDS
    buffer = torch.randn(3 * block + 50, device=device)
    assert buffer.data_ptr() % 16 == 0
    for offset in range(4):
        view = buffer[offset : offset + 2 * block + 5]
        table, programs = _hash_triton._table([_hash_torch.words_of(view)], torch.device(device))
        rows = table.cpu().tolist()
        assert programs == (1 if offset else 0) + 3
        assert [r[1] for r in rows] == ([4 - offset] if offset else []) + [
            block,
            block,
            2 * block + 5 - block * 2 - (4 - offset) % 4,
        ]
        assert all(r[0] % 16 == 0 for r in rows if r[1] == block)
        assert hash_tensor(view) == fast_reference(view.cpu())
