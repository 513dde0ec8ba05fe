from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bisect_repro.capture.hash_format import digest_of
from bisect_repro.capture.hashing import PendingHashes, hash_tensor, hash_tensors

MASK = 0xFFFFFFFF
# Under Triton's interpreter (tests/capture/test_hash_triton.py) every hash runs the kernel in
# Python: a tenth of the examples there, each property still run.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def examples(n: int) -> int:
    return max(6, n // 10) if INTERPRETED else n


# Every test here runs twice: through the C kernel and through the torch-op path (conftest.py).
pytestmark = pytest.mark.usefixtures("backend")


def reference(tensor: torch.Tensor) -> str:
    """The documented algorithm, word by word in plain Python."""
    flat = tensor.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    data = flat.view(torch.uint8).numpy().tobytes()
    data += b"\0" * (-len(data) % 4)
    lane0 = lane1 = 0
    for i, word in enumerate(np.frombuffer(data, dtype="<u4").tolist()):
        p = (i * 0x9E3779B1 + 0x7F4A7C15) & MASK
        x = word ^ p
        x ^= x >> 16
        x = (x * 0x85EBCA6B) & MASK
        x ^= x >> 13
        x = (x * 0xC2B2AE35) & MASK
        x ^= x >> 16
        lane0 = (lane0 + x) & MASK
        lane1 = (lane1 + x * (p | 1)) & MASK
    return digest_of(tensor.dtype, tuple(tensor.shape), lane0, lane1)


DTYPES = [np.float32, np.float64, np.int64, np.int32, np.uint8, np.int16, np.bool_, np.float16]
arrays = st.sampled_from(DTYPES).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9))
)


@settings(max_examples=examples(60), deadline=None)
@given(arrays)
def test_matches_the_documented_algorithm(array: np.ndarray) -> None:
    tensor = torch.from_numpy(array.copy())
    assert hash_tensor(tensor) == reference(tensor)


def test_large_tensors_take_the_chunked_path_and_match_the_algorithm() -> None:
    tensor = torch.randint(
        -(2**31),
        2**31 - 1,
        (300_001,),
        dtype=torch.int32,
        generator=torch.Generator().manual_seed(1),
    )
    assert hash_tensor(tensor) == reference(tensor)


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_any_single_bit_flip_changes_the_hash(data: st.DataObject) -> None:
    array = data.draw(hnp.arrays(np.float32, st.integers(1, 64)))
    flipped = array.copy().view(np.uint8)
    byte = data.draw(st.integers(0, flipped.size - 1))
    flipped[byte] ^= 1 << data.draw(st.integers(0, 7))
    assert hash_tensor(torch.from_numpy(array)) != hash_tensor(
        torch.from_numpy(flipped.view(np.float32))
    )


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_swapping_two_unequal_elements_changes_the_hash(data: st.DataObject) -> None:
    array = data.draw(hnp.arrays(np.int64, st.integers(2, 64), elements=st.integers(-1000, 1000)))
    i = data.draw(st.integers(0, array.size - 1))
    j = data.draw(st.integers(0, array.size - 1).filter(lambda k: k != i))
    if array[i] == array[j]:
        array[i] += 1
    swapped = array.copy()
    swapped[[i, j]] = swapped[[j, i]]
    assert hash_tensor(torch.from_numpy(array)) != hash_tensor(torch.from_numpy(swapped))


def test_equal_values_do_not_cancel() -> None:
    # A XOR reduction gives [v, v] the same hash as [0, 0]; this one must not.
    digests = {hash_tensor(torch.tensor([v, v], dtype=torch.int32)) for v in (0, 1, 7, 1 << 20)}
    assert len(digests) == 4
    assert hash_tensor(torch.tensor([5.0, 5.0])) != hash_tensor(torch.zeros(2))


def test_dtype_and_shape_are_part_of_the_hash() -> None:
    x = torch.arange(12, dtype=torch.int32)
    assert hash_tensor(x) != hash_tensor(x.reshape(3, 4))
    assert hash_tensor(x) != hash_tensor(x.view(torch.float32))


def test_views_hash_by_logical_content() -> None:
    x = torch.randn(7, 5)
    assert hash_tensor(x.t()) == hash_tensor(x.t().contiguous())
    assert hash_tensor(x[2:5, 1:4]) == hash_tensor(x[2:5, 1:4].clone())
    raw = torch.arange(11, dtype=torch.uint8)
    assert hash_tensor(raw[1:]) == hash_tensor(raw[1:].clone())  # unaligned storage offset


def test_many_tensors_fetch_together_and_keep_their_order() -> None:
    tensors = {f"t{i}": torch.randn(i + 1) for i in range(50)}
    tensors["big"] = torch.randn(400_000)
    pending = PendingHashes()
    pending.add(tensors)
    found = pending.fetch()
    assert list(found) == list(tensors)
    assert found == {name: hash_tensor(t) for name, t in tensors.items()}


def test_numpy_arrays_hash_like_tensors() -> None:
    array = np.arange(10, dtype=np.float64)
    assert hash_tensors({"a": array})["a"] == hash_tensor(torch.from_numpy(array))


@pytest.mark.cuda
def test_cuda_and_cpu_give_the_same_hash() -> None:
    for tensor in (
        torch.randn(1000, 33),
        torch.randint(0, 255, (5_000_001,), dtype=torch.uint8),
        torch.randn(17, dtype=torch.bfloat16),
    ):
        assert hash_tensor(tensor.cuda()) == hash_tensor(tensor)


# -- the fast paths against the definition ----------------------------------------------------
# A vectorised copy of the definition (numpy, uint64 arithmetic masked to 32 bits) so that the
# property tests can use tensors far larger than the word-by-word reference could check in time.


def fast_reference_lanes(tensor: torch.Tensor) -> tuple[int, int]:
    flat = torch.empty(tensor.numel(), dtype=tensor.dtype).copy_(tensor.reshape(-1))
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    data = flat.view(torch.uint8).numpy().tobytes()
    data += b"\0" * (-len(data) % 4)
    w = np.frombuffer(data, dtype="<u4").astype(np.uint64)
    i = np.arange(w.size, dtype=np.uint64)
    p = (i * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & np.uint64(MASK)
    x = w ^ p
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(0x85EBCA6B)) & np.uint64(MASK)
    x ^= x >> np.uint64(13)
    x = (x * np.uint64(0xC2B2AE35)) & np.uint64(MASK)
    x ^= x >> np.uint64(16)
    lane1 = (x * (p | np.uint64(1))) & np.uint64(MASK)  # each product < 2**64: exact in uint64
    return int(x.sum(dtype=np.uint64)) & MASK, int(lane1.sum(dtype=np.uint64)) & MASK


def fast_reference(tensor: torch.Tensor) -> str:
    return digest_of(tensor.dtype, tuple(tensor.shape), *fast_reference_lanes(tensor))


TORCH_DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
]


@st.composite
def tensors(draw: st.DrawFn, max_side: int = 30) -> torch.Tensor:
    """Random tensors of every dtype, including empty ones, transposed and strided views, and
    views at odd storage offsets (unaligned data pointers)."""
    dtype = draw(st.sampled_from(TORCH_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, max_side), min_size=0, max_size=3)))
    offset = draw(st.integers(0, 3))
    count = int(np.prod(shape)) if shape else 1
    seed = draw(st.integers(0, 2**32 - 1))
    nbytes = (count + offset) * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(
        0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed)
    )
    if dtype == torch.bool:  # a bool byte other than 0 or 1 is not a valid bool
        raw &= 1
    base = raw.view(dtype)[offset : offset + count].reshape(shape)
    view = draw(st.sampled_from(["as is", "transposed", "strided", "flipped"]))
    if view == "transposed" and base.dim() >= 2:
        return base.transpose(0, -1)
    if view == "strided" and base.dim() >= 1:
        return base[::2]
    if view == "flipped" and base.dim() >= 1:
        return base.flip(0)
    return base


def test_the_fast_reference_is_the_documented_algorithm() -> None:
    for seed in range(20):
        tensor = torch.randint(
            -(2**31),
            2**31 - 1,
            (seed * 37 + 1,),
            dtype=torch.int32,
            generator=torch.Generator().manual_seed(seed),
        )
        assert fast_reference(tensor) == reference(tensor)
    assert fast_reference(torch.tensor([True, False, True])) == reference(
        torch.tensor([True, False, True])
    )


@settings(max_examples=examples(150), deadline=None)
@given(
    st.lists(tensors(), min_size=1, max_size=6),
    st.sampled_from([2, 6, 64, 1000]),
    st.sampled_from([1, 8, 100]),
    st.sampled_from([1, 16, 300]),
)
def test_the_chunked_and_packed_paths_match_the_definition(
    batch: list[torch.Tensor], chunk: int, pack: int, pack_chunk: int
) -> None:
    # Tiny chunk and pack sizes so that small tensors cross every boundary the real sizes have.
    from unittest import mock

    from bisect_repro.capture import _hash_torch, hashing

    named = {f"t{i}": t for i, t in enumerate(batch)}
    with (
        mock.patch.object(_hash_torch, "CHUNK_WORDS", chunk),
        mock.patch.multiple(hashing, _PACK_WORDS=pack, _PACK_CHUNK=pack_chunk),
    ):
        found = hash_tensors(named)
    assert found == {name: fast_reference(t) for name, t in named.items()}


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=5), st.sampled_from([2, 64, 1000]))
def test_the_device_side_accumulation_matches_the_host_one(
    batch: list[torch.Tensor], chunk: int
) -> None:
    # The branches that CUDA without Triton (and other devices) take, run on CPU tensors.
    from unittest import mock

    from bisect_repro.capture import _hash_torch

    words = [_hash_torch.words_of(t) for t in batch]
    expected = [list(fast_reference_lanes(t)) for t in batch]
    with mock.patch.object(_hash_torch, "CHUNK_WORDS", chunk):
        large = [
            _hash_torch.lanes_of_large(w, host_sums=False).tolist() if w.numel() else [0, 0]
            for w in words
        ]
    assert large == expected
    present = [w for w in words if w.numel()]
    if present:
        assert _hash_torch.lanes_of_small(present, numpy=False).tolist() == [
            e for w, e in zip(words, expected, strict=True) if w.numel()
        ]


def test_chunk_boundaries_at_the_real_sizes() -> None:
    from bisect_repro.capture import _hash_torch, hashing

    generator = torch.Generator().manual_seed(3)
    chunk, pack = _hash_torch.CHUNK_WORDS, hashing._PACK_WORDS
    for words in (chunk - 1, chunk, 2 * chunk + 3, pack - 1, pack):
        tensor = torch.randint(
            -(2**31), 2**31 - 1, (words,), dtype=torch.int32, generator=generator
        )
        assert hash_tensor(tensor) == fast_reference(tensor)
    odd_bytes = torch.randint(
        0, 255, (4 * _hash_torch.CHUNK_WORDS + 5,), dtype=torch.uint8, generator=generator
    )
    assert hash_tensor(odd_bytes[1:]) == fast_reference(odd_bytes[1:])


def test_a_wrong_word_is_caught_by_the_property_reference() -> None:
    # The reference the property tests rely on must itself tell tensors apart.
    tensor = torch.randn(5000)
    changed = tensor.clone()
    changed[4321] = -changed[4321]
    assert fast_reference(tensor) != fast_reference(changed)
    assert hash_tensor(changed) == fast_reference(changed) != hash_tensor(tensor)


def test_a_failing_kernel_falls_back_to_torch_ops_with_a_warning() -> None:
    from unittest import mock

    from bisect_repro.capture import _hash_torch, hashing

    class BrokenKernel:
        def lanes(self, words: list[torch.Tensor]) -> torch.Tensor:
            raise RuntimeError("no usable GPU toolchain")

    batch = [torch.randn(3, 5), torch.zeros(0), torch.arange(300_000, dtype=torch.int32)]
    broken = mock.patch.object(hashing, "_triton_kernel", lambda: BrokenKernel())
    with (
        broken,
        mock.patch.object(hashing, "_triton_failed", False),
        mock.patch.object(hashing, "_BACKEND", "auto"),
    ):
        with pytest.warns(UserWarning, match="Triton hash kernel failed"):
            lanes = hashing._fused_lanes([_hash_torch.words_of(t) for t in batch])
        assert hashing._triton_failed and hashing._triton_module() is None  # not tried again
    assert lanes.tolist() == [list(fast_reference_lanes(t)) for t in batch]
