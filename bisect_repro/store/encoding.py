"""A prepared tree's file made in one pass: the safetensors layout, zstandard and the checksum.

A file is a safetensors file (the tensors, and the tree's JSON skeleton in the header's
``__metadata__``) compressed into one zstandard frame that declares its decompressed size, named
in the run index by its compressed size and checksum (see :mod:`bisect_repro.store.codec`).

Design decisions:

- The file is never held whole in memory, uncompressed or compressed. :class:`Encoding` builds
  the safetensors header itself and feeds it, then each host tensor's memory as it is, to one
  zstandard compressor; the compressed bytes come out in chunks, each added to the checksum as it
  is handed over to be written. A checkpoint thus reads each tensor once, where writing the
  safetensors bytes, compressing them and checksumming the result went over fresh memory three
  times: on a 17 MB checkpoint, 32 ms of a core against 70 ms (``benchmarks/NOTES.md``).
- The uncompressed bytes are those of safetensors' own ``save`` for the same tensors and
  metadata: tensors ordered by dtype as safetensors orders them (:data:`SAFETENSORS_ORDER`, larger
  elements first, so each stays aligned), then by name; the JSON compact, in UTF-8; the header
  padded with spaces to a multiple of 8 bytes. A property test holds this against the library.
- The compressed bytes are those of a fresh compressor: the one kept per thread and level keeps no
  history from one file to the next.

Where the guarantees stop: the tensors' memory is written as it is, so the host must be
little-endian (as every host PyTorch trains on is); a dtype safetensors has no name for is refused.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any

import torch
import zstandard

from ..errors import UnstorableError

__all__ = [
    "CHUNK",
    "LEVEL",
    "SAFETENSORS_ORDER",
    "TENSOR_BYTES",
    "TENSOR_LEVEL",
    "Encoding",
    "level_for",
    "new_digest",
]

LEVEL = 1
"""The zstandard level of a file that is mostly structure (a snapshot: digests, stream states,
the data position), which compresses several times over at any level."""
TENSOR_LEVEL = -1
"""The level of a file that is mostly tensor bytes (a checkpoint: weights, optimizer state).
Measured on a 2M-parameter CNN's 17 MB checkpoint, on one core: level 1 writes 0.927 of the raw
bytes at 0.86 GB/s, level -1 writes 0.995 at 3.3 GB/s. Trained float32 values barely compress,
and the writer's thread takes its core from the training's threads, so a checkpoint is stored
almost as it is (zeros and repeated values still shrink at this level)."""
TENSOR_BYTES = 1 << 20
"""A file with at least this many tensor bytes is written at :data:`TENSOR_LEVEL`."""
CHUNK = 1 << 20
"""Compressed bytes handed over to be written at a time."""

_NAMES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.float32: "F32",
    torch.complex64: "C64",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.uint64: "U64",
}
SAFETENSORS_ORDER = (
    "BOOL",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
"""safetensors' dtypes in the order of its ``Dtype`` enum; ``save`` writes tensors in the reverse
of this order, then by name."""
_RANK = {name: rank for rank, name in enumerate(SAFETENSORS_ORDER)}


def level_for(tensor_bytes: int) -> int:
    """The zstandard level of a file holding ``tensor_bytes`` bytes of tensors."""
    return TENSOR_LEVEL if tensor_bytes >= TENSOR_BYTES else LEVEL


def new_digest() -> Any:
    """The hash a file's checksum is made with (BLAKE2b, 16 bytes; its hexadecimal digest is the
    checksum)."""
    return hashlib.blake2b(digest_size=16)


# one compressor per thread and level: a new one costs a context allocation
_COMPRESSORS = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    kept: dict[int, zstandard.ZstdCompressor] | None = getattr(_COMPRESSORS, "by_level", None)
    if kept is None:
        kept = _COMPRESSORS.by_level = {}
    found = kept.get(level)
    if found is None:
        found = kept[level] = zstandard.ZstdCompressor(level=level)
    return found


def _dtype_name(key: str, tensor: torch.Tensor) -> str:
    name = _NAMES.get(tensor.dtype)
    if name is None:
        raise UnstorableError(
            f"state tensor {key}: a {tensor.dtype} tensor cannot be stored in safetensors; convert "
            "it first"
        )
    return name


def _layout(skeleton: str, tensors: dict[str, torch.Tensor]) -> tuple[bytes, list[memoryview], int]:
    """The safetensors file's first bytes (its header's length and the header), each tensor's
    memory in file order, and the file's whole size."""
    named = {key: _dtype_name(key, tensor) for key, tensor in tensors.items()}
    order = sorted(tensors, key=lambda key: (-_RANK[named[key]], key))
    header: dict[str, Any] = {"__metadata__": {"bisect_repro": skeleton}}
    pieces: list[memoryview] = []
    offset = 0
    for key in order:
        tensor = tensors[key]
        size = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": named[key],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
        if size:  # a host copy: contiguous, on the CPU
            pieces.append(tensor.reshape(-1).view(torch.uint8).numpy().data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, pieces, 8 + len(text) + offset


class Encoding:
    """A prepared tree's file (its JSON ``skeleton`` and contiguous host ``tensors``, which must
    not change until it is written), produced in compressed chunks as it is iterated, once.

    ``raw_size`` is known from the start; ``size`` and ``checksum`` once the iteration ended::

        encoding = Encoding(skeleton, tensors, level=LEVEL)
        for chunk in encoding:
            handle.write(chunk)
        entry = (encoding.size, encoding.raw_size, encoding.checksum)
    """

    def __init__(self, skeleton: str, tensors: dict[str, torch.Tensor], *, level: int) -> None:
        if sys.byteorder != "little":
            raise UnstorableError(
                "state files are little-endian; this host is not, so it cannot write them"
            )
        self._first, self._pieces, self.raw_size = _layout(skeleton, tensors)
        self.level = level
        self.size = 0
        self._digest = new_digest()
        self._state = "new"

    def __iter__(self) -> Iterator[bytes]:
        if self._state != "new":
            raise RuntimeError("an Encoding is iterated once")
        self._state = "running"
        chunker = _compressor(self.level).chunker(size=self.raw_size, chunk_size=CHUNK)
        pieces: list[bytes | memoryview] = [self._first, *self._pieces]
        for piece in pieces:
            yield from map(self._count, chunker.compress(piece))
        yield from map(self._count, chunker.finish())  # type: ignore[no-untyped-call]  # zstandard's stub leaves it untyped
        self._state = "done"

    def _count(self, chunk: bytes) -> bytes:
        self.size += len(chunk)
        self._digest.update(chunk)
        return chunk

    @property
    def checksum(self) -> str:
        """The checksum of the compressed bytes, once they have all been produced."""
        if self._state != "done":
            raise RuntimeError(
                "the checksum of an Encoding is known once it has been iterated to its end"
            )
        return str(self._digest.hexdigest())
