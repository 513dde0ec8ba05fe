"""The C kernel of the CPU hash against the definition, and the torch-op fallback without it.

The kernel is checked at every vector level the test machine has (portable, AVX2, AVX-512), with
thread counts and chunk sizes chosen so that chunk and thread boundaries fall inside tensors, at
odd word positions and inside vector blocks. Kernels built with one wrong constant each show that
these checks can fail. ``conftest.py`` builds the kernel from source where it is not installed.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_repro.capture import _hash_cpu, _hash_torch, hashing
from bisect_repro.capture.hashing import hash_tensor, hash_tensors

from .test_hashing import fast_reference, fast_reference_lanes, tensors

ROOT = Path(__file__).resolve().parents[2]


def expected_lanes(batch: list[torch.Tensor]) -> list[list[int]]:
    return [list(fast_reference_lanes(t)) for t in batch]


def kernel_lanes(
    kernel: _hash_cpu.Kernel, batch: list[torch.Tensor], **options: int
) -> list[list[int]]:
    buffers = [hashing._native_buffer(t) for t in batch]
    assert all(b is not None for b in buffers)
    return kernel.lanes(buffers, **options).tolist()  # type: ignore[arg-type]


@st.composite
def byte_runs(draw: st.DrawFn) -> torch.Tensor:
    """Byte tensors of 0 to 300 words plus 0 to 3 bytes, starting 0 to 3 bytes past an aligned
    address: every vector block boundary, head and padded tail."""
    length = draw(st.integers(0, 300)) * 4 + draw(st.integers(0, 3))
    offset = draw(st.integers(0, 3))
    seed = draw(st.integers(0, 2**32 - 1))
    raw = torch.randint(
        0, 256, (length + offset,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    return raw[offset:]


def levels(kernel: _hash_cpu.Kernel) -> list[int]:
    return list(range(kernel.best_level + 1))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.one_of(tensors(max_side=40), byte_runs()), min_size=1, max_size=8),
    st.integers(1, 5),
    st.sampled_from([1, 3, 17, 64, 1000, _hash_cpu.CHUNK_WORDS]),
    st.booleans(),
    st.data(),
)
def test_the_kernel_matches_the_definition_at_every_level_and_split(
    c_kernel: _hash_cpu.Kernel,
    batch: list[torch.Tensor],
    threads: int,
    chunk_words: int,
    use_team: bool,
    data: st.DataObject,
) -> None:
    level = data.draw(st.sampled_from(levels(c_kernel)), label="level")
    found = kernel_lanes(
        c_kernel, batch, threads=threads, chunk_words=chunk_words, level=level, use_team=use_team
    )
    assert found == expected_lanes(batch)


def test_big_tensors_across_chunks_threads_and_levels(c_kernel: _hash_cpu.Kernel) -> None:
    generator = torch.Generator().manual_seed(5)
    raw = torch.randint(
        0, 256, (3 * _hash_cpu.CHUNK_WORDS * 4 + 7,), dtype=torch.uint8, generator=generator
    )
    batch = [
        raw[1:],  # unaligned, an odd byte count, three chunks and a bit
        torch.randn(1000, 300, generator=generator).t(),  # a transposed view: copied, then hashed
        # exactly one chunk
        torch.randint(
            -(2**31), 2**31 - 1, (_hash_cpu.CHUNK_WORDS,), dtype=torch.int32, generator=generator
        ),
        torch.randn(5, generator=generator),
        torch.zeros(0),
    ]
    expected = expected_lanes(batch)
    splits = (
        (1, _hash_cpu.CHUNK_WORDS),
        (2, _hash_cpu.CHUNK_WORDS),
        (3, 12_345),
        (64, 4_099),
        (200, 1 << 20),
    )
    for level, (threads, chunk_words), use_team in itertools.product(
        levels(c_kernel), splits, (True, False)
    ):
        found = kernel_lanes(
            c_kernel,
            batch,
            threads=threads,
            chunk_words=chunk_words,
            level=level,
            use_team=use_team,
        )
        assert found == expected, (level, threads, chunk_words, use_team)


def test_torch_openmp_threads_are_found_where_torch_runs_on_them(
    c_kernel: _hash_cpu.Kernel,
) -> None:
    if not (sys.platform.startswith("linux") and torch._C.has_openmp):
        pytest.skip("the kernel looks for torch's OpenMP runtime on Linux only")
    assert c_kernel.team is not None


MUTANTS = {
    "BR_STEP": "0x9E3779B3u",
    "BR_SEED": "0x7F4A7C14u",
    "BR_MIX1": "0x85EBCA6Fu",
    "BR_MIX2": "0xC2B2AE37u",
    "BR_SHIFT1": "15",
    "BR_SHIFT2": "14",
    "BR_SHIFT3": "17",
}


@pytest.mark.slow
@pytest.mark.parametrize(("macro", "value"), MUTANTS.items())
def test_a_kernel_with_a_wrong_constant_is_caught(build_kernel, macro: str, value: str) -> None:
    generator = torch.Generator().manual_seed(11)
    # from 2 words: the step enters
    batch = [torch.randn(n, generator=generator) for n in (2, 7, 33, 100, 1000)]
    expected = expected_lanes(batch)
    # the shipped constants, built the same way: pass
    assert kernel_lanes(build_kernel(), batch) == expected
    mutant = build_kernel(**{macro: value})
    for level in levels(mutant):
        got = kernel_lanes(mutant, batch, level=level)
        # every tensor's lanes differ
        assert all(g != e for g, e in zip(got, expected, strict=True)), (macro, level)


def test_an_unsupported_level_is_refused(c_kernel: _hash_cpu.Kernel) -> None:
    with pytest.raises(ValueError, match="not supported"):
        c_kernel.lanes([torch.ones(3)], level=len(_hash_cpu.LEVELS))


def test_hash_tensors_takes_the_kernel_for_every_plain_cpu_tensor(
    c_kernel: _hash_cpu.Kernel,
) -> None:
    class Tagged(torch.Tensor):
        pass

    generator = torch.Generator().manual_seed(2)
    named = {
        "weight": torch.nn.Parameter(torch.randn(30, 20, generator=generator)),
        "strided": torch.randn(9, 9, generator=generator)[::2, 1::3],
        "sparse": torch.randn(6, 6, generator=generator).relu().to_sparse(),
        # the torch-op path, in the same call
        "subclass": torch.randn(4, generator=generator).as_subclass(Tagged),
        "empty": torch.zeros(3, 0),
        "array": np.arange(10, dtype=np.int16),
        "bool": torch.tensor([True, False, True]),
        "big": torch.randn(300_001, generator=generator),
    }
    spy = mock.Mock(wraps=c_kernel.lanes_of_buffers)
    with (
        mock.patch.object(hashing, "_BACKEND", "auto"),
        mock.patch.object(_hash_cpu, "load", lambda: c_kernel),
        mock.patch.object(c_kernel, "lanes_of_buffers", spy),
    ):
        found = hash_tensors(named)
    # all but the subclass, in one call
    assert spy.call_count == 1 and len(spy.call_args.args[0]) == len(named) - 1
    assert list(found) == list(named)
    as_tensors = {
        n: v.to_dense() if isinstance(v, torch.Tensor) and v.is_sparse else v
        for n, v in named.items()
    }
    assert found == {n: fast_reference(torch.as_tensor(v)) for n, v in as_tensors.items()}


def test_lazy_conjugate_and_negative_views_behave_as_before(c_kernel: _hash_cpu.Kernel) -> None:
    # The torch-op path refuses a lazy conjugate (its bytes are not its values) and hashes a
    # strided negative view by value (copying it resolves the bit); the kernel path must agree.
    z = torch.randn(4, dtype=torch.complex64, generator=torch.Generator().manual_seed(6))
    for backend in ("auto", "torch"):
        with (
            mock.patch.object(hashing, "_BACKEND", backend),
            mock.patch.object(_hash_cpu, "load", lambda: c_kernel),
        ):
            with pytest.raises(RuntimeError, match="conjugate view"):
                hash_tensor(z.conj())
            assert z.conj().imag.is_neg()
            assert hash_tensor(z.conj().imag) == fast_reference(-z.imag)
            assert hash_tensor(z.conj().resolve_conj()) == fast_reference(z.conj().resolve_conj())


# -- without the kernel ------------------------------------------------------------------------


def fallback_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(8)
    named = {f"t{i}": torch.randn(i * 97 + 1, generator=generator) for i in range(20)}
    named["big"] = torch.randn(400_003, generator=generator)
    return named


def test_without_the_extension_the_torch_path_hashes(tmp_path: Path) -> None:
    # Runs without a compiler too: the package as installed where the kernel could not be built.
    named = fallback_inputs()
    missing = tmp_path / "not-built.so"
    with (
        mock.patch.object(hashing, "_BACKEND", "auto"),
        mock.patch.object(_hash_cpu, "load", _hash_cpu.load.__wrapped__),
        mock.patch.object(_hash_cpu, "library_path", lambda: missing),
        mock.patch.object(_hash_torch, "lanes_of_large", wraps=_hash_torch.lanes_of_large) as large,
        mock.patch.object(_hash_torch, "lanes_of_small", wraps=_hash_torch.lanes_of_small) as small,
    ):
        assert hashing._native_kernel() is None
        without = hash_tensors(named)
    assert large.called and small.called  # the torch-op path did the work
    assert without == {name: fast_reference(t) for name, t in named.items()}


def test_the_kernel_and_the_fallback_give_the_same_digests(c_kernel: _hash_cpu.Kernel) -> None:
    named = fallback_inputs()
    with (
        mock.patch.object(hashing, "_BACKEND", "c"),
        mock.patch.object(_hash_cpu, "load", lambda: c_kernel),
    ):
        with_kernel = hash_tensors(named)
    with mock.patch.object(hashing, "_BACKEND", "torch"):
        assert hash_tensors(named) == with_kernel


def test_a_library_that_does_not_load_warns_and_falls_back(tmp_path: Path) -> None:
    broken = tmp_path / "_hash_c.so"
    broken.write_bytes(b"not a shared library")
    fresh = functools.cache(_hash_cpu.load.__wrapped__)  # loaded once per process, as the real one
    with (
        mock.patch.object(_hash_cpu, "load", fresh),
        mock.patch.object(_hash_cpu, "library_path", lambda: broken),
    ):
        with pytest.warns(UserWarning, match="does not load"):
            assert _hash_cpu.load() is None
        assert _hash_cpu.load() is None  # tried once


def test_requiring_the_kernel_where_it_is_missing_is_an_error(tmp_path: Path) -> None:
    with (
        mock.patch.object(hashing, "_BACKEND", "c"),
        mock.patch.object(_hash_cpu, "load", _hash_cpu.load.__wrapped__),
        mock.patch.object(_hash_cpu, "library_path", lambda: tmp_path / "missing.so"),
        pytest.raises(RuntimeError, match="BISECT_REPRO_HASH_BACKEND=c"),
    ):
        hash_tensor(torch.ones(3))


def switch_inputs() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(4)
    return {
        "a": torch.randn(77, generator=generator),
        "b": torch.randn(300_001, generator=generator),
        "c": torch.arange(9).byte(),
    }


CHILD = """
import json, torch
from bisect_repro.capture import hashing
from tests.capture.test_hash_cpu import switch_inputs
named = switch_inputs()
native = hashing._native_kernel() is not None
print(json.dumps({"native": native, "digests": hashing.hash_tensors(named)}))
"""


def test_the_environment_switch_forces_the_torch_path() -> None:
    env = {**os.environ, "BISECT_REPRO_HASH_BACKEND": "torch"}
    done = subprocess.run(
        [sys.executable, "-c", CHILD],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child["native"] is False
    assert child["digests"] == {name: fast_reference(t) for name, t in switch_inputs().items()}


INSTALLED = """
import json
from bisect_repro.capture import _hash_cpu, hashing
path = _hash_cpu.library_path()
kernel = type(hashing._native_kernel()).__name__
print(json.dumps({"path": str(path), "built": path.is_file(), "kernel": kernel}))
"""


def test_the_installed_kernel_is_used_where_it_was_built(tmp_path) -> None:
    # The package as installed, imported from outside the checkout: beside the sources for an
    # editable install, in site-packages for a regular one (CI's, while its tests import the
    # checkout).
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("BISECT_REPRO_HASH_BACKEND", "PYTHONPATH")
    }
    done = subprocess.run(
        [sys.executable, "-c", INSTALLED],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    child = json.loads(done.stdout.strip().splitlines()[-1])
    if not child["built"]:
        pytest.skip(
            f"no kernel at {child['path']}: the package was installed where no C compiler was"
        )
    assert child["kernel"] == "Kernel", child


@pytest.mark.parametrize("path", ["c", "torch"])
def test_a_name_added_twice_keeps_its_first_place_and_its_last_digest(
    request: pytest.FixtureRequest, path: str
) -> None:
    kernel = request.getfixturevalue("c_kernel") if path == "c" else None
    with (
        mock.patch.object(hashing, "_BACKEND", path),
        mock.patch.object(_hash_cpu, "load", lambda: kernel),
    ):
        pending = hashing.PendingHashes()
        pending.add({"a": torch.zeros(3), "b": torch.ones(2)})
        pending.add({"c": torch.arange(4), "a": torch.ones(3)})
        found = pending.fetch()
    assert list(found) == ["a", "b", "c"]
    assert found == {
        "a": fast_reference(torch.ones(3)),
        "b": fast_reference(torch.ones(2)),
        "c": fast_reference(torch.arange(4)),
    }
