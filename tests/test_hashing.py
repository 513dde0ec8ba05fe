from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from bisect_repro.hashing import PendingHashes, digest_of, hash_tensor, hash_tensors

MASK = 0xFFFFFFFF


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
arrays = st.sampled_from(DTYPES).flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, max_side=9)))


@settings(max_examples=60, deadline=None)
@given(arrays)
def test_matches_the_documented_algorithm(array: np.ndarray) -> None:
    tensor = torch.from_numpy(array.copy())
    assert hash_tensor(tensor) == reference(tensor)


def test_large_tensors_take_the_chunked_path_and_match_the_algorithm() -> None:
    tensor = torch.randint(-(2**31), 2**31 - 1, (300_001,), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    assert hash_tensor(tensor) == reference(tensor)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_single_bit_flip_changes_the_hash(data: st.DataObject) -> None:
    array = data.draw(hnp.arrays(np.float32, st.integers(1, 64)))
    flipped = array.copy().view(np.uint8)
    byte = data.draw(st.integers(0, flipped.size - 1))
    flipped[byte] ^= 1 << data.draw(st.integers(0, 7))
    assert hash_tensor(torch.from_numpy(array)) != hash_tensor(torch.from_numpy(flipped.view(np.float32)))


@settings(max_examples=60, deadline=None)
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
    for tensor in (torch.randn(1000, 33), torch.randint(0, 255, (5_000_001,), dtype=torch.uint8), torch.randn(17, dtype=torch.bfloat16)):
        assert hash_tensor(tensor.cuda()) == hash_tensor(tensor)
