"""The format-1 tensor hash as one fused Triton kernel over many tensors (CUDA).

Private to :mod:`bisect_repro.capture.hashing`, which picks it; the hash is defined in
:mod:`bisect_repro.capture.hash_format`, and this module only computes the same two lane sums
faster. Triton is an optional import: it ships with the CUDA builds of torch and is never a
dependency of bisect-repro.

One launch covers every tensor of a call. The host cuts each tensor's words into *blocks* of at
most ``_BLOCK_WORDS`` words and writes one row per block into a table: the block's address, its
word count, the row of the output it adds to, and the position key of its first word. Each
program of the kernel reads its row, streams its block once (loads, a few integer operations per
word, two running sums in registers) and adds its two partial sums to its tensor's row of the
output with integer atomics. Sums modulo 2**32 are exact and order-independent, so the atomics
make the result deterministic; no float is involved anywhere.

Full blocks start 16-byte aligned and take an unmasked loop (128-bit loads); only a tensor's
last block, and a short head block up to its first 16-byte boundary, are masked.
Tables depend only on the addresses and sizes, which are the same at every snapshot of a model,
so they are uploaded once and cached on the device.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

try:  # optional: present with CUDA builds of torch
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the installation
    triton = None
    tl = None

__all__ = ["available", "lanes"]

_POSITION_STEP = 0x9E3779B1
_POSITION_SEED = 0x7F4A7C15
_MASK32 = 0xFFFFFFFF

_VECTOR = 1024  # words per loop iteration of a program: 8 words (32 bytes) per thread with 4 warps
_ITERATIONS = 16
# 64 KiB per program: enough work to hide the launch of a program
_BLOCK_WORDS = _VECTOR * _ITERATIONS
_ALIGN = 16  # bytes; full blocks start at multiples of this, so their loads can be 128-bit wide


def available() -> bool:
    """Whether Triton can be imported (a CUDA device is the caller's to check)."""
    return triton is not None


def _mix(w, p):  # type: ignore[no-untyped-def]
    """The definition's per-word term: the word keyed by its position, through murmur3's
    finaliser."""
    x = w ^ p
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


# the kernel calls it, so it must be a Triton function before the kernel compiles
if triton is not None:
    _mix = triton.jit(_mix)


def _hash_blocks(table_ptr, out_ptr, VECTOR: tl.constexpr, ITERATIONS: tl.constexpr):  # type: ignore[no-untyped-def]
    """One program per table row: the lane sums of one block, added to its tensor's output row.

    The pointers carry no annotation because Triton reads annotations as kernel types; the table
    is ``int64[blocks, 4]`` and the output ``int32[tensors, 2]``.
    """
    row = table_ptr + tl.program_id(0) * 4
    address = tl.load(row)
    count = tl.load(row + 1)
    target = tl.load(row + 2)
    key = tl.load(row + 3).to(tl.uint32)  # position key of the block's first word, below 2**32
    lanes = tl.arange(0, VECTOR)
    sum0 = tl.zeros([VECTOR], dtype=tl.uint32)
    sum1 = tl.zeros([VECTOR], dtype=tl.uint32)
    # a full block, 16-byte aligned (see _table): no masks, 128-bit loads
    if count == VECTOR * ITERATIONS:
        # address // 16 * 16 is address itself here. The hint sits on a pointer of this branch only,
        # so the masked branch, which may be unaligned, keeps its scalar loads.
        words = tl.multiple_of((address // 16 * 16).to(tl.pointer_type(tl.int32)), 16)
        for step in range(ITERATIONS):
            index = step * VECTOR + lanes
            w = tl.load(words + index).to(tl.uint32, bitcast=True)
            p = key + index.to(tl.uint32) * 0x9E3779B1
            x = _mix(w, p)  # type: ignore[no-untyped-call]  # a Triton function: Triton reads annotations as kernel types
            sum0 += x
            sum1 += x * (p | 1)
    else:  # a tensor's unaligned head or its last block: any 4-byte alignment
        words = address.to(tl.pointer_type(tl.int32))
        # a constant trip count: count <= VECTOR * ITERATIONS, the rest is masked
        for step in range(ITERATIONS):
            index = step * VECTOR + lanes
            inside = index < count
            w = tl.load(words + index, mask=inside, other=0).to(tl.uint32, bitcast=True)
            p = key + index.to(tl.uint32) * 0x9E3779B1
            x = _mix(w, p)  # type: ignore[no-untyped-call]  # a Triton function: Triton reads annotations as kernel types
            x = tl.where(inside, x, 0)  # padding words are not zero after mixing: drop them
            sum0 += x
            sum1 += x * (p | 1)
    total0 = tl.sum(sum0, axis=0).to(tl.int32, bitcast=True)
    total1 = tl.sum(sum1, axis=0).to(tl.int32, bitcast=True)
    # integer atomics: exact whatever the order
    tl.atomic_add(out_ptr + target * 2, total0, sem="relaxed")
    tl.atomic_add(out_ptr + target * 2 + 1, total1, sem="relaxed")


_KERNEL: list[Any] = []
_TABLES: dict[tuple[Any, ...], tuple[torch.Tensor, int]] = {}
_LOCK = threading.Lock()


def _kernel() -> Any:
    """The jitted kernel, built on first use. With ``TRITON_INTERPRET=1`` set before Triton is
    first imported, Triton's interpreter runs it on CPU tensors instead (how the tests check it)."""
    if not _KERNEL:
        _KERNEL.append(triton.jit(_hash_blocks))
    return _KERNEL[0]


def _table(words: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, int]:
    """Rows ``(address, count, output row, first position key)``, one per block, on the device."""
    addresses = np.array([w.data_ptr() for w in words], dtype=np.int64)
    # words: the tensors' bytes are whole words
    sizes = np.array([w.nbytes >> 2 for w in words], dtype=np.int64)
    cache_key = (device, _BLOCK_WORDS, addresses.tobytes(), sizes.tobytes())
    with _LOCK:
        cached = _TABLES.get(cache_key)
    if cached is not None:
        return cached
    # Full blocks start on a 16-byte boundary so that their loads can be 128-bit wide; a tensor
    # whose data does not (a view into a flat buffer, say) gets a short head block up to it.
    head = np.minimum((-addresses % _ALIGN) // 4, sizes)
    has_head = (head > 0).astype(np.int64)
    blocks = has_head + -(-(sizes - head) // _BLOCK_WORDS)
    tensor_of_block = np.repeat(np.arange(len(words), dtype=np.int64), blocks)
    first_block = np.cumsum(blocks) - blocks
    # block index within its tensor
    j = np.arange(int(blocks.sum()), dtype=np.int64) - np.repeat(first_block, blocks)
    is_head = (has_head[tensor_of_block] == 1) & (j == 0)
    start = np.where(
        is_head, 0, head[tensor_of_block] + (j - has_head[tensor_of_block]) * _BLOCK_WORDS
    )
    end = np.where(
        is_head, head[tensor_of_block], np.minimum(start + _BLOCK_WORDS, sizes[tensor_of_block])
    )
    rows = np.empty((start.size, 4), dtype=np.int64)
    rows[:, 0] = addresses[tensor_of_block] + 4 * start
    rows[:, 1] = end - start
    rows[:, 2] = tensor_of_block
    # start * STEP overflows for large tensors: uint64 arithmetic wraps modulo 2**64, which keeps
    # the low 32 bits, the only ones the key has.
    rows[:, 3] = (
        (start.astype(np.uint64) * np.uint64(_POSITION_STEP) + np.uint64(_POSITION_SEED))
        & np.uint64(_MASK32)
    ).astype(np.int64)
    host = torch.from_numpy(rows)
    # Pinned and non_blocking on CUDA: the upload is queued on the stream and does not wait for the
    # GPU.
    table = (
        host.pin_memory().to(device, non_blocking=True)
        if device.type == "cuda"
        else host.to(device)
    )
    result = (table, int(start.size))
    with _LOCK:
        if len(_TABLES) >= 32:
            _TABLES.clear()
        _TABLES[cache_key] = result
    return result


def lanes(words: Sequence[torch.Tensor]) -> torch.Tensor:
    """Lane sums of the bytes of k tensors: int32 ``[k, 2]`` holding each sum's 32 bits, on the
    device, not synchronised. Read as unsigned on the host (``& 0xFFFFFFFF`` of their int64); no
    device op converts them, since each would be one more launch per snapshot.

    Every tensor must be contiguous, on the same device, with a data pointer aligned to 4 bytes and
    a whole number of 4-byte words (``words_of`` makes any tensor so). Empty tensors give zero
    lanes.
    """
    device = words[0].device
    out = torch.zeros((len(words), 2), dtype=torch.int32, device=device)
    table, programs = _table(words, device)  # an empty tensor has no blocks: its row stays zero
    if programs:
        # Triton launches on the current CUDA device: make it the tensors' one (cuda:1 and up).
        elsewhere = (
            device.type == "cuda"
            and device.index is not None
            and device.index != torch.cuda.current_device()
        )
        with torch.cuda.device(device) if elsewhere else contextlib.nullcontext():
            _kernel()[(programs,)](table, out, VECTOR=_VECTOR, ITERATIONS=_ITERATIONS, num_warps=4)
    return out
