"""Content hashes of tensors, computed where the tensors live.

The algorithm (format 1)
------------------------
A tensor's bytes, in row-major order of its logical elements and the little-endian layout that
every supported device uses, are zero-padded to a multiple of four and read as 32-bit words
``w[0..n)``. For each word, with ``i`` its position and all arithmetic modulo 2**32::

    p = i * 0x9E3779B1 + 0x7F4A7C15           # a distinct odd-step position key
    x = w ^ p
    x ^= x >> 16; x *= 0x85EBCA6B             # murmur3's 32-bit finaliser: a bijection
    x ^= x >> 13; x *= 0xC2B2AE35
    x ^= x >> 16
    lane0 += x
    lane1 += x * (p | 1)

The digest is the first 8 bytes of BLAKE2b over ``dtype, shape, lane0, lane1``, written as 16
hex digits.

Why this definition
-------------------
- For a fixed position the map from ``w`` to ``x`` is a bijection, so changing any one word (any
  single bit flip) always changes ``lane0``; ``lane1`` multiplies by an odd number, which is
  invertible, so it always changes too.
- The position enters every term, so swapping two unequal elements changes the sums, and equal
  values do not cancel (unlike ``torch.hash_tensor``'s XOR, or a norm).
- Sums modulo 2**32 are associative and exact, so any reduction order gives the same value: a
  tensor has the same digest on the CPU and on CUDA, whatever the thread or block count.
- Every term is a few integer operations on one word followed by a sum: one fused pass over the
  tensor, which a single GPU kernel can run at memory bandwidth.

Where the guarantees stop: it is a checksum against accident, not a cryptographic hash; positions
are taken modulo 2**32, so two tensors over 16 GiB that differ only by words 16 GiB apart could
collide in theory.

Implementation
--------------
Torch integer ops on the tensor's own device (wrapping int32 arithmetic, logical shifts emulated
by masking). Tensors smaller than a chunk are packed together and reduced with one segmented sum,
so a model's many small tensors cost few launches; lanes stay on the device until
:meth:`PendingHashes.fetch`, which moves all of them in one transfer per device.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PendingHashes", "digest_of", "hash_tensor", "hash_tensors"]

_POSITION_STEP = 0x9E3779B1
_POSITION_SEED = 0x7F4A7C15
_MIX1 = 0x85EBCA6B
_MIX2 = 0xC2B2AE35
_MASK32 = 0xFFFFFFFF
_CHUNK_WORDS = 1 << 18  # 1 MiB of words: temporaries stay in cache on a CPU


def _signed32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


_ARANGE_CACHE: dict[tuple[torch.device, int], torch.Tensor] = {}
_PACK_CACHE: dict[tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor]] = {}


def _position_keys(device: torch.device, count: int) -> torch.Tensor:
    """``i * STEP`` for ``i < count`` as wrapped int32, cached per device."""
    key = (device, count)
    cached = _ARANGE_CACHE.get(key)
    if cached is None:
        wide = torch.arange(count, dtype=torch.int64, device=device) * _POSITION_STEP
        cached = (wide & _MASK32).to(torch.int32)  # int64 -> int32 keeps the low 32 bits
        _ARANGE_CACHE[key] = cached
    return cached


def _words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat int32 tensor, zero-padded to whole words."""
    flat = tensor.detach()
    if flat.layout != torch.strided:
        flat = flat.to_dense()
    flat = flat.contiguous().reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    raw = flat.view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    try:
        return raw.view(torch.int32)
    except RuntimeError:  # storage offset not word-aligned
        return raw.clone().view(torch.int32)


def _mix(words: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-word terms of lane 0 and lane 1 (int32, wrapping)."""
    x = words ^ positions
    x ^= (x >> 16) & 0xFFFF
    x *= _signed32(_MIX1)
    x ^= (x >> 13) & 0x7FFFF
    x *= _signed32(_MIX2)
    x ^= (x >> 16) & 0xFFFF
    return x, x * (positions | 1)


def _lanes_of_large(words: torch.Tensor) -> torch.Tensor:
    """Lane sums (int64[2], on the device) of one tensor of at least a chunk of words."""
    total = torch.zeros(2, dtype=torch.int64, device=words.device)
    keys = _position_keys(words.device, _CHUNK_WORDS)
    for start in range(0, words.numel(), _CHUNK_WORDS):
        chunk = words[start : start + _CHUNK_WORDS]
        offset = _signed32(start * _POSITION_STEP + _POSITION_SEED)
        positions = keys[: chunk.numel()] + offset
        lane0, lane1 = _mix(chunk, positions)
        total[0] += lane0.sum(dtype=torch.int64)
        total[1] += lane1.sum(dtype=torch.int64)
    return total & _MASK32


def _pack_layout(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Position keys within each packed tensor, and the end offset of each segment."""
    key = (device, sizes)
    cached = _PACK_CACHE.get(key)
    if cached is None:
        lengths = torch.tensor(sizes, dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        index = torch.arange(int(lengths.sum()), dtype=torch.int64) - torch.repeat_interleave(starts, lengths)
        positions = ((index * _POSITION_STEP + _POSITION_SEED) & _MASK32).to(torch.int32)
        ends = torch.cumsum(lengths, 0)
        cached = (positions.to(device), ends.to(device))
        if len(_PACK_CACHE) > 64:
            _PACK_CACHE.clear()
        _PACK_CACHE[key] = cached
    return cached


def _lanes_of_small(group: list[torch.Tensor]) -> torch.Tensor:
    """Lane sums (int64[k, 2]) of k small word tensors, in one segmented reduction."""
    device = group[0].device
    sizes = tuple(int(w.numel()) for w in group)
    positions, ends = _pack_layout(device, sizes)
    words = torch.cat(group) if len(group) > 1 else group[0]
    lane0, lane1 = _mix(words, positions)
    terms = torch.stack([lane0, lane1], dim=1).to(torch.int64)
    running = torch.cat([terms.new_zeros(1, 2), torch.cumsum(terms, 0)])
    return (running[ends] - running[ends - torch.tensor(sizes, device=device)]) & _MASK32


def digest_of(dtype: torch.dtype | str, shape: tuple[int, ...] | list[int], lane0: int, lane1: int) -> str:
    """Combine two lane sums with the dtype and shape into the 16-hex-digit digest."""
    name = str(dtype).removeprefix("torch.")
    text = f"{name}|{','.join(str(int(d)) for d in shape)}|{lane0:08x}{lane1:08x}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@dataclass(frozen=True)
class _Entry:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class PendingHashes:
    """Hashes enqueued on their devices and fetched later, all together.

    :meth:`add` launches the work and returns at once, with no host-device synchronisation;
    :meth:`fetch` moves every lane sum to the host in one transfer per device.
    """

    def __init__(self) -> None:
        self._entries: dict[torch.device, list[_Entry]] = {}
        self._lanes: dict[torch.device, list[torch.Tensor]] = {}
        self._order: list[str] = []

    def __len__(self) -> int:
        return len(self._order)

    def add(self, tensors: Mapping[str, torch.Tensor | np.ndarray]) -> None:
        small: dict[torch.device, list[tuple[_Entry, torch.Tensor]]] = {}
        for name, value in tensors.items():
            tensor = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            entry = _Entry(name, tensor.dtype, tuple(tensor.shape))
            self._order.append(name)
            words = _words(tensor)
            if words.numel() >= _CHUNK_WORDS:
                self._push(words.device, [entry], _lanes_of_large(words).unsqueeze(0))
            else:
                small.setdefault(words.device, []).append((entry, words))
        for device, items in small.items():
            for start in range(0, len(items), 4096):
                batch = items[start : start + 4096]
                self._push(device, [e for e, _ in batch], _lanes_of_small([w for _, w in batch]))

    def _push(self, device: torch.device, entries: list[_Entry], lanes: torch.Tensor) -> None:
        self._entries.setdefault(device, []).extend(entries)
        self._lanes.setdefault(device, []).append(lanes)

    def fetch(self) -> dict[str, str]:
        """Digests by name, in the order they were added."""
        found: dict[str, str] = {}
        for device, entries in self._entries.items():
            lanes = torch.cat(self._lanes[device]).cpu().tolist()
            for entry, (lane0, lane1) in zip(entries, lanes, strict=True):
                found[entry.name] = digest_of(entry.dtype, entry.shape, lane0, lane1)
        return {name: found[name] for name in self._order}


def hash_tensors(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, str]:
    """Digest of every tensor, by name, with one host transfer per device."""
    pending = PendingHashes()
    pending.add(tensors)
    return pending.fetch()


def hash_tensor(tensor: torch.Tensor | np.ndarray) -> str:
    """Digest of one tensor (a host synchronisation: prefer :func:`hash_tensors`)."""
    return hash_tensors({"": tensor})[""]
