"""The format-1 tensor hash in torch integer ops, on the tensor's own device.

Private to :mod:`bisect_repro.capture.hashing`, which picks this path where neither kernel
applies (no C compiler at install, devices other than the CPU and CUDA, or the switch); the hash
is defined in :mod:`bisect_repro.capture.hash_format`. This module only computes its two lane
sums, with ops every device has.

The definition's uint32 arithmetic runs in wrapping int32 ops, with logical shifts emulated by
masking. A large tensor (:func:`lanes_of_large`) is read a cache-sized chunk at a time, in place
in two scratch buffers, so that the 16 passes a chunk needs stay in cache; torch spreads each op
over the intra-op threads. Small tensors (:func:`lanes_of_small`) are packed together and reduced
with one segmented sum, so a model's many small tensors cost few ops. Position keys are cached
per device and size.

Where the guarantees stop: the lanes are exact for any chunk and pack size (sums modulo 2**32);
a lazy conjugate view is refused (torch will not view its bytes as words), as it always has been;
on the CPU the sums are taken on the host, elsewhere they stay on the device until the caller
fetches them.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from .hash_format import MASK32, MIX1, MIX2, POSITION_SEED, POSITION_STEP

__all__ = ["CHUNK_WORDS", "lanes_of_large", "lanes_of_small", "words_of"]

# 256 Ki words (1 MiB) per chunk: the two 1 MiB scratch buffers stay in the two cores' L2, and a
# chunk is big enough that the per-op dispatch cost (a few microseconds) is small next to the work.
CHUNK_WORDS = 1 << 18


def _signed32(value: int) -> int:
    value &= MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


_LOCK = threading.Lock()  # the caches below may be filled from several threads
_KEYS_CACHE: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
_PACK_CACHE: dict[
    tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]
] = {}


def _position_keys(device: torch.device, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position keys ``p`` and ``p | 1`` of words ``0 .. count`` as wrapped int32, cached per
    device.

    A chunk starting at word ``s`` adds ``s * STEP``; ``s`` is even, so ``p | 1`` is shifted the
    same way (the low bit of ``p`` depends only on ``i``'s parity)."""
    key = (device, count)
    cached = _KEYS_CACHE.get(key)
    if cached is None:
        wide = torch.arange(count, dtype=torch.int64) * POSITION_STEP + POSITION_SEED
        keys = (wide & MASK32).to(torch.int32)  # int64 -> int32 keeps the low 32 bits
        cached = (keys.to(device), (keys | 1).to(device))
        with _LOCK:
            if len(_KEYS_CACHE) >= 16:
                _KEYS_CACHE.clear()
            _KEYS_CACHE[key] = cached
    return cached


def words_of(tensor: torch.Tensor, *, align: int = 4) -> torch.Tensor:
    """The tensor's bytes as a flat int32 tensor, zero-padded to whole words.

    A copy only where needed: non-contiguous views, a byte count that is not a multiple of four,
    or a data pointer that is not a multiple of ``align`` bytes."""
    flat = tensor.detach()
    if flat.layout != torch.strided:
        flat = flat.to_dense()
    flat = flat.contiguous().reshape(-1)
    # "contiguous" with a stride: torch ignores the strides of size-1 and empty dims
    if flat.numel() <= 1 and flat.stride(0) != 1:
        flat = flat.new_empty(flat.shape).copy_(flat)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    raw = flat.view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    if raw.numel() == 0:
        return raw.new_empty(0, dtype=torch.int32)
    if raw.data_ptr() % align or raw.storage_offset() % 4:  # a view at an odd storage offset
        raw = raw.clone()
    return raw.view(torch.int32)


_SCRATCH = threading.local()


def _scratch(device: torch.device, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two int32 buffers of ``size`` words. On the CPU they are kept per thread: a fresh 1 MiB
    allocation is a fresh mapping, and its page faults cost as much as hashing a chunk."""
    if device.type != "cpu":  # the caching allocator already recycles device memory
        x = torch.empty(size, dtype=torch.int32, device=device)
        return x, torch.empty_like(x)
    kept: tuple[torch.Tensor, torch.Tensor] | None = getattr(_SCRATCH, "buffers", None)
    if kept is None or kept[0].numel() < size:
        kept = (
            torch.empty(CHUNK_WORDS, dtype=torch.int32),
            torch.empty(CHUNK_WORDS, dtype=torch.int32),
        )
        _SCRATCH.buffers = kept
    return kept[0][:size], kept[1][:size]


def _xorshift_right(x: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    """``x ^= x >>> shift`` in place on int32: torch's ``>>`` is arithmetic, so mask the sign
    copies."""
    torch.bitwise_right_shift(x, shift, out=scratch)
    scratch.bitwise_and_((1 << (32 - shift)) - 1)
    x.bitwise_xor_(scratch)


def _mix_in_place(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """murmur3's finaliser on int32 words, in place (multiplication wraps like uint32)."""
    _xorshift_right(x, 16, scratch)
    x.mul_(_signed32(MIX1))
    _xorshift_right(x, 13, scratch)
    x.mul_(_signed32(MIX2))
    _xorshift_right(x, 16, scratch)


def _sum32(x: torch.Tensor) -> torch.Tensor:
    """The sum of int32 terms; only its value modulo 2**32 is used.

    On the CPU the int32 accumulator wraps exactly like uint32 and sums at twice the speed of an
    int64 one; elsewhere int64, whose low 32 bits are the same."""
    return x.sum(dtype=torch.int32 if x.device.type == "cpu" else torch.int64)


def lanes_of_large(words: torch.Tensor, *, host_sums: bool | None = None) -> torch.Tensor:
    """Lane sums (int64[2], on the device) of one flat int32 tensor, a chunk at a time.

    A chunk at word ``s`` has position keys ``p = keys + s * STEP`` and ``p | 1 = odd_keys + s *
    STEP``, so its lane 1 is ``sum(x * odd_keys) + s * STEP * sum(x)``: one op fewer than forming
    ``p | 1``. (``p | 1 = odd_keys + s * STEP`` needs ``s * STEP`` even, that is ``s`` even.)
    Every op but the first (the one read of the tensor) works in place on a cache-sized buffer.
    ``host_sums`` (default: on the CPU) accumulates in Python integers, else on the device.
    """
    device = words.device
    on_cpu = device.type == "cpu" if host_sums is None else host_sums
    chunk_words = CHUNK_WORDS & ~1  # chunks must start at even words (see above)
    size = min(chunk_words, words.numel())
    # one table per device, sliced for shorter tensors
    keys, odd_keys = _position_keys(device, chunk_words)
    x, scratch = _scratch(device, size)
    lane0 = lane1 = 0
    parts: list[torch.Tensor] = []
    for start in range(0, words.numel(), size):
        chunk = words[start : start + size]
        n = chunk.numel()
        xn = x[:n]
        offset = (start * POSITION_STEP) & MASK32
        torch.add(keys[:n], _signed32(offset), out=xn)  # p
        xn.bitwise_xor_(chunk)
        _mix_in_place(xn, scratch[:n])
        sum0 = _sum32(xn)
        xn.mul_(odd_keys[:n])
        sum1 = _sum32(xn)
        if on_cpu:  # no device to wait for: plain integers are the cheapest accumulator
            s0 = int(sum0)
            lane0 += s0
            lane1 += int(sum1) + s0 * offset
        else:  # stays on the device: no synchronisation
            sum0 = sum0.to(torch.int64)
            parts.append(torch.stack([sum0, sum1.to(torch.int64) + (sum0 & MASK32) * offset]))
    if on_cpu:
        return torch.tensor([lane0 & MASK32, lane1 & MASK32], dtype=torch.int64)
    return torch.stack(parts).sum(0) & MASK32


def _pack_layout(
    device: torch.device, sizes: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position keys ``p`` and ``p | 1`` within each packed tensor, and each segment's first
    word."""
    key = (device, sizes)
    cached = _PACK_CACHE.get(key)
    if cached is None:
        lengths = torch.tensor(sizes, dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        index = torch.arange(int(lengths.sum()), dtype=torch.int64) - torch.repeat_interleave(
            starts, lengths
        )
        positions = ((index * POSITION_STEP + POSITION_SEED) & MASK32).to(torch.int32)
        cached = (positions.to(device), (positions | 1).to(device), starts.to(device))
        with _LOCK:
            # a model has a few layouts; a stream of new ones must not grow this
            if len(_PACK_CACHE) >= 64:
                _PACK_CACHE.clear()
            _PACK_CACHE[key] = cached
    return cached


def _segment_sums(
    terms: torch.Tensor, starts: torch.Tensor, *, numpy: bool | None = None
) -> torch.Tensor:
    """Sums (int64, modulo 2**32) of the consecutive non-empty segments of int32 ``terms``.

    ``numpy`` (default: on the CPU) uses numpy's segmented sum, else a device cumsum."""
    # one pass, wrapping in uint32, no int64 copy
    if terms.device.type == "cpu" if numpy is None else numpy:
        sums = np.add.reduceat(terms.numpy().view(np.uint32), starts.numpy(), dtype=np.uint32)
        return torch.from_numpy(sums.astype(np.int64))
    running = torch.cat(
        [terms.new_zeros(1, dtype=torch.int64), torch.cumsum(terms, 0, dtype=torch.int64)]
    )
    ends = torch.cat([starts[1:], starts.new_tensor([terms.numel()])])
    return (running[ends] - running[starts]) & MASK32


def lanes_of_small(group: list[torch.Tensor], *, numpy: bool | None = None) -> torch.Tensor:
    """Lane sums (int64[k, 2]) of k small non-empty word tensors, in one segmented reduction."""
    device = group[0].device
    positions, odd_positions, starts = _pack_layout(device, tuple(int(w.numel()) for w in group))
    x = torch.cat(group)
    x.bitwise_xor_(positions)
    _mix_in_place(x, torch.empty_like(x))
    lane0 = _segment_sums(x, starts, numpy=numpy)
    x.mul_(odd_positions)
    lane1 = _segment_sums(x, starts, numpy=numpy)
    return torch.stack([lane0, lane1], dim=1)
