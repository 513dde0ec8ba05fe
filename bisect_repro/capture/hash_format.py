"""The tensor content hash, format 1: its definition, and the digest made from its two lane sums.

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

This module holds the definition's constants and its last step, the digest of two lane sums
(:func:`digest_of`, and :func:`digests` for many tensors at once). The lane sums themselves are
computed in :mod:`bisect_repro.capture.hashing`, which picks one of three implementations per
device.

Where the guarantees stop: it is a checksum against accident, not a cryptographic hash; positions
are taken modulo 2**32, so two tensors over 16 GiB that differ only by words 16 GiB apart could
collide in theory.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

__all__ = [
    "MASK32",
    "MIX1",
    "MIX2",
    "POSITION_SEED",
    "POSITION_STEP",
    "Entry",
    "digest_of",
    "digests",
]

POSITION_STEP = 0x9E3779B1
POSITION_SEED = 0x7F4A7C15
MIX1 = 0x85EBCA6B
MIX2 = 0xC2B2AE35
MASK32 = 0xFFFFFFFF


def digest_of(
    dtype: torch.dtype | str, shape: tuple[int, ...] | list[int], lane0: int, lane1: int
) -> str:
    """Combine two lane sums with the dtype and shape into the 16-hex-digit digest."""
    name = str(dtype).removeprefix("torch.")
    text = f"{name}|{','.join(str(int(d)) for d in shape)}|{lane0:08x}{lane1:08x}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


Entry = tuple[str, torch.dtype, torch.Size]
"""A tensor's name, dtype and shape: a plain tuple, the cheapest record to keep per tensor."""

_PREFIXES: dict[tuple[torch.dtype, torch.Size], bytes] = {}


def digests(entries: list[Entry], lanes: np.ndarray) -> list[str]:
    """:func:`digest_of` of many tensors: the same text, built with less work per tensor.

    ``lanes``: int64[k, 2], each in [0, 2**32), in the order of ``entries``. The ``dtype|shape|``
    prefixes are cached, since a model hashes the same few of them at every snapshot, and the 16
    hex digits of every tensor's lanes come from one conversion."""
    hex_lanes = lanes.astype(">u4").tobytes().hex().encode()
    blake2b = hashlib.blake2b
    found = []
    for k, (_, dtype, shape) in enumerate(entries):
        prefix = _PREFIXES.get((dtype, shape))
        if prefix is None:
            dims = ",".join(str(int(d)) for d in shape)
            prefix = f"{str(dtype).removeprefix('torch.')}|{dims}|".encode()
            if len(_PREFIXES) >= 4096:  # a stream of new shapes must not grow this without bound
                _PREFIXES.clear()
            _PREFIXES[dtype, shape] = prefix
        found.append(blake2b(prefix + hex_lanes[16 * k : 16 * k + 16], digest_size=8).hexdigest())
    return found
