"""State trees to bytes and back: safetensors for tensors, JSON for everything else, zstandard.

A state tree is what ``state_dict()`` methods return: dicts, lists, tuples, tensors, NumPy
arrays, numbers, strings, booleans, ``None`` and ``torch.dtype``. :func:`encode` splits a tree
into its tensors (stored as safetensors) and a JSON skeleton (stored in the safetensors header's
``__metadata__``, where each tensor is a ``{"__tensor__": key}`` reference), then compresses the
whole file with zstandard. Nothing is ever pickled, and decoding never imports or runs anything.

Encoding is split in two so that the recorder can write in the background: :func:`prepare` runs
on the training thread and takes host copies of every tensor (the training may change its own the
moment it goes on) and a JSON-only skeleton, sharing nothing mutable with the tree;
:func:`encoding_of` makes the file from that on any thread, chunk by chunk as it is written
(:mod:`bisect_repro.store.encoding`), and :func:`encode_prepared` makes it whole.

:func:`decode` validates before it touches data, in the manner of safetensors itself: the
compressed size and checksum against what the index declared, the declared decompressed size
against a cap, the header length against the file and against the caps below (read from the
first 8 bytes decompressed alone, before the rest), every tensor's dtype, shape and offsets
(integers, not booleans, multiplied exactly: no wrap) within the data and non-overlapping; the
skeleton's markers are interpreted as data only (a ``__dtype__`` must name a ``torch.dtype``,
never any other attribute). Any failure is a :class:`RunFormatError` naming the file.

JSON is measured before it is parsed (the caps and their reasons are at ``_HEADER_CAP``): the
header at most 100 MB (safetensors' own limit) and 1 MiB + 64 bytes per compressed byte, with at
most 1 million + 16 values per compressed byte (16 million in all); the skeleton at most 64 MiB +
4 KiB per tensor entry and 4 million + 64 values per entry.

Where the guarantees stop: the memory a decode takes is bounded by the decompressed size the
caller declares (the run index), and a declared size larger than this machine's memory is refused
up front; a run that honestly declares a huge snapshot still needs that much memory to read it.
Within the caps, a crafted file can still make a decode parse up to 16 JSON values for each byte
it ships (about 1 KB of memory per byte), and a highly compressible file of zeros can declare as
much decompressed data as the machine has memory.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import torch
import zstandard
from safetensors.torch import load as load_safetensors

from ..errors import RunFormatError, UnstorableError
from .encoding import LEVEL, TENSOR_LEVEL, Encoding, level_for, new_digest
from .files import parse_json

__all__ = [
    "LEVEL",
    "TENSOR_LEVEL",
    "Prepared",
    "checksum",
    "decode",
    "encode",
    "encode_prepared",
    "encoding_of",
    "memory_cap",
    "prepare",
]

# Caps on the JSON inside a file, set where no real file reaches and a crafted one is refused
# before it is parsed (json.loads builds about 64 bytes of objects per value: a 22 KB file whose
# 99 MB skeleton was parsed took 5 GB). Measured: a snapshot of 200,000 hashes (a 50,000-tensor
# model with Adam, DeepSeek-V3's size) has a 20 MB header, 6.6 times its compressed file, and
# 470,000 values; a checkpoint of 80,000 one-element zero tensors, the most compressible real
# case, has a header 13 times its compressed file and 1.7 values per compressed byte.
_HEADER_CAP = 100_000_000  # safetensors' own limit on a header
_HEADER_FLOOR = 1 << 20
# header bytes per compressed byte: 5x the most measured; a bomb is 1,000x and more
_HEADER_RATIO = 64
_HEADER_NODES = 16_000_000
_NODE_FLOOR = 1_000_000
_NODE_RATIO = 16  # header values per compressed byte: 9x the most measured
# The skeleton (state without its tensors): a checkpoint's is about 100 bytes and 5 values per
# tensor entry; a snapshot's holds hashes, not tensors, and has few entries, which the floors
# cover (the 200,000-hash snapshot above is 20 MB and 470,000 values: a third of the floor and
# less).
_SKELETON_FLOOR = 64 << 20
_SKELETON_PER_ENTRY = 4096
_SKELETON_NODES = 4_000_000
_SKELETON_NODES_PER_ENTRY = 64
_DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}


def checksum(data: bytes) -> str:
    """A file's checksum, as the run index names it."""
    digest = new_digest()
    digest.update(data)
    return str(digest.hexdigest())


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor that shares no storage with the training state."""
    tensor = tensor.detach()
    if tensor.device.type == "cpu":
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor.to("cpu").contiguous()


# stored as they are: checked first, by exact type
_LEAVES = frozenset({str, int, float, bool, type(None)})


def _flatten(tree: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if type(tree) in _LEAVES:
        return tree
    if isinstance(tree, torch.Tensor):
        key = str(len(tensors))
        tensors[key] = _host_copy(tree)
        return {"__tensor__": key}
    if isinstance(tree, np.ndarray):
        key = str(len(tensors))
        tensors[key] = torch.from_numpy(np.ascontiguousarray(tree)).clone()
        return {"__ndarray__": key}
    if isinstance(tree, dict):
        if all(isinstance(k, str) for k in tree):
            if any(k.startswith("__") and k.endswith("__") for k in tree):
                return {
                    "__dict__": [[k, _flatten(v, tensors, f"{where}.{k}")] for k, v in tree.items()]
                }
            return {k: _flatten(v, tensors, f"{where}.{k}") for k, v in tree.items()}
        return {
            "__dict__": [
                [_flatten(k, tensors, where), _flatten(v, tensors, f"{where}.{k}")]
                for k, v in tree.items()
            ]
        }
    if isinstance(tree, tuple):
        return {"__tuple__": _flatten_items(tree, tensors, where)}
    if isinstance(tree, list):
        return _flatten_items(tree, tensors, where)
    if isinstance(tree, torch.dtype):
        return {"__dtype__": str(tree).removeprefix("torch.")}
    if isinstance(tree, (np.integer, np.floating, np.bool_)):
        return tree.item()
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    raise UnstorableError(
        f"{where}: a {type(tree).__name__} cannot be stored without pickle; "
        "keep state dicts to tensors, arrays, numbers, strings, lists, tuples and dicts"
    )


def _flatten_items(
    items: list[Any] | tuple[Any, ...], tensors: dict[str, torch.Tensor], where: str
) -> list[Any]:
    """The items of a list or tuple, flattened; a sequence of plain values (a Python random state
    is 625 ints, in every snapshot) as it is, without a call per item."""
    if all(type(v) in _LEAVES for v in items):
        return list(items)
    return [_flatten(v, tensors, f"{where}[{i}]") for i, v in enumerate(items)]


def _unflatten(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, list):
        return [_unflatten(v, tensors) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if "__tensor__" in tree:
        return tensors[tree["__tensor__"]]
    if "__ndarray__" in tree:
        return tensors[tree["__ndarray__"]].numpy()
    if "__tuple__" in tree:
        return tuple(_unflatten(v, tensors) for v in tree["__tuple__"])
    if "__dtype__" in tree:
        dtype = (
            getattr(torch, tree["__dtype__"], None) if isinstance(tree["__dtype__"], str) else None
        )
        # a name is looked up, never anything else handed back
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"{tree['__dtype__']!r} is not a torch dtype")
        return dtype
    if "__dict__" in tree:
        return {
            _hashable(_unflatten(k, tensors)): _unflatten(v, tensors) for k, v in tree["__dict__"]
        }
    return {k: _unflatten(v, tensors) for k, v in tree.items()}


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


@dataclass(frozen=True)
class Prepared:
    """A state tree taken apart for writing: a JSON skeleton and host tensors that alias nothing."""

    skeleton: str
    tensors: dict[str, torch.Tensor]

    @property
    def nbytes(self) -> int:
        return len(self.skeleton) + sum(t.numel() * t.element_size() for t in self.tensors.values())


def prepare(tree: Any) -> Prepared:
    """Host copies of a tree's tensors and its skeleton; after this the tree may change freely."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten(tree, tensors, "state")
    return Prepared(json.dumps(skeleton), tensors)


def level_of(prepared: Prepared) -> int:
    """The zstandard level for a prepared tree: :data:`~bisect_repro.store.encoding.TENSOR_LEVEL`
    for one that is mostly tensor bytes."""
    return level_for(prepared.nbytes - len(prepared.skeleton))


def encoding_of(prepared: Prepared, *, level: int | None = None) -> Encoding:
    """A prepared tree's file, made as it is written (at ``level``, by default :func:`level_of`
    it): see :mod:`bisect_repro.store.encoding`."""
    return Encoding(
        prepared.skeleton, prepared.tensors, level=level_of(prepared) if level is None else level
    )


def encode_prepared(prepared: Prepared, *, level: int | None = None) -> tuple[bytes, int]:
    """The compressed file for a prepared tree, whole, and its uncompressed size (see
    :func:`encoding_of`)."""
    encoding = encoding_of(prepared, level=level)
    return b"".join(encoding), encoding.raw_size


def encode(tree: Any, *, level: int | None = None) -> tuple[bytes, int]:
    """The compressed file for a state tree, and its uncompressed size."""
    return encode_prepared(prepare(tree), level=level)


def _header_length(path: Path, data: bytes, raw_size: int) -> int:
    """The safetensors header's length, from the first 8 bytes decompressed alone, checked against
    the file and the caps before the whole frame is decompressed (a bomb costs nothing to
    refuse)."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(data) as reader:
            first = reader.read(8)
    except zstandard.ZstdError as error:
        raise RunFormatError(
            path, f"truncated or corrupt zstandard frame ({error})", "the file is damaged"
        ) from None
    if raw_size < 8:
        raise RunFormatError(
            path, "truncated safetensors data (no header length)", "the file is damaged"
        )
    if len(first) < 8:
        raise RunFormatError(
            path,
            f"truncated or corrupt zstandard frame ({len(first)} bytes of {raw_size})",
            "the file is damaged",
        )
    length: int = struct.unpack("<Q", first)[0]
    if length > raw_size - 8:
        raise RunFormatError(
            path,
            f"safetensors header length {length} exceeds the file ({raw_size} bytes)",
            "the file is damaged",
        )
    cap = min(_HEADER_CAP, _HEADER_FLOOR + _HEADER_RATIO * len(data))
    if length > cap:
        raise RunFormatError(
            path,
            f"safetensors header of {length} bytes in {len(data)} compressed bytes, more than a "
            f"real one (at most {cap})",
            "the file is crafted or damaged",
        )
    return length


def _parse_header(path: Path, raw: bytes, length: int, compressed: int) -> dict[str, Any]:
    nodes = min(_HEADER_NODES, _NODE_FLOOR + _NODE_RATIO * compressed)
    header = parse_json(raw[8 : 8 + length], path, "safetensors header", max_nodes=nodes)
    if not isinstance(header, dict):
        raise RunFormatError(path, "safetensors header is not a JSON object", "the file is damaged")
    return header


def _is_count(value: Any) -> bool:
    return type(value) is int and value >= 0  # not a bool, not a float: exact arithmetic below


def _elements(shape: list[int], bound: int) -> int:
    """The product of a shape in Python's exact integers (``np.prod`` in int64 wraps: [2**32, 2**32]
    is 0), stopped once past ``bound``: a thousand huge dimensions never make a huge number."""
    if 0 in shape:
        return 0
    count = 1
    for dimension in shape:
        count *= dimension
        if count > bound:
            break
    return count


def _named(name: str) -> str:
    # a crafted name may be megabytes long
    return repr(name if len(name) <= 80 else name[:80] + "...")


def _span(info: Any, data_size: int) -> tuple[int, int] | None:
    """The ``(begin, end)`` data offsets of a header entry; ``None`` for a bad dtype, shape or
    offsets."""
    if not isinstance(info, dict):
        return None
    dtype, shape, offsets = (info.get(k) for k in ("dtype", "shape", "data_offsets"))
    if not (
        isinstance(dtype, str)
        and dtype in _DTYPE_SIZES
        and isinstance(shape, list)
        and all(map(_is_count, shape))
    ):
        return None
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
        return None
    begin, end = offsets
    if not (
        begin <= end <= data_size
        and end - begin == _elements(shape, data_size) * _DTYPE_SIZES[dtype]
    ):
        return None
    return begin, end


def _validate_layout(path: Path, header: dict[str, Any], data_size: int) -> None:
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        span = _span(info, data_size)
        if span is None:
            raise RunFormatError(
                path,
                f"safetensors entry {_named(name)} has a bad dtype, shape or offsets",
                "the file is damaged",
            )
        begin, end = span
        spans.append((begin, end, name))
    spans.sort()
    for (_, end, first), (begin, _, second) in itertools.pairwise(spans):
        if begin < end:
            raise RunFormatError(
                path,
                f"safetensors entries {_named(first)} and {_named(second)} overlap",
                "the file is damaged",
            )


def _skeleton(path: Path, header: dict[str, Any]) -> Any:
    """The JSON skeleton in ``__metadata__``, parsed only within caps set by the tensor entries the
    header declares."""
    metadata = header.get("__metadata__")
    skeleton = metadata.get("bisect_repro") if isinstance(metadata, dict) else None
    if not isinstance(skeleton, str):
        raise RunFormatError(
            path,
            "safetensors metadata holds no bisect-repro state",
            "the file is damaged or not a bisect-repro file",
        )
    entries = len(header) - 1
    cap = _SKELETON_FLOOR + _SKELETON_PER_ENTRY * entries
    if len(skeleton) > cap:
        problem = (
            f"state of {len(skeleton)} characters for {entries} tensors, more than a real "
            f"one ({cap})"
        )
        raise RunFormatError(path, problem, "the file is crafted or damaged")
    return parse_json(
        skeleton, path, "state", max_nodes=_SKELETON_NODES + _SKELETON_NODES_PER_ENTRY * entries
    )


def decode(data: bytes, path: Path, *, raw_size: int, digest: str | None = None) -> Any:
    """The state tree in a file's bytes, after validating everything it declares."""
    if digest is not None and checksum(data) != digest:
        raise RunFormatError(
            path,
            "checksum does not match the run index (the file is damaged or was changed)",
            "re-record the run or restore the file",
        )
    try:
        declared = zstandard.frame_content_size(data)
    except zstandard.ZstdError:
        raise RunFormatError(path, "not a zstandard frame", "the file is damaged") from None
    if declared != raw_size:
        raise RunFormatError(
            path,
            f"zstandard frame declares {declared} bytes, the run index {raw_size}",
            "the file is damaged",
        )
    if raw_size > _memory_cap():
        raise RunFormatError(
            path,
            f"declares {raw_size} bytes decompressed, more than this machine's memory",
            "read the run on a larger machine",
        )
    length = _header_length(path, data, raw_size)
    try:
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_size)
    except zstandard.ZstdError as error:
        raise RunFormatError(
            path, f"truncated or corrupt zstandard frame ({error})", "the file is damaged"
        ) from None
    except MemoryError:
        raise RunFormatError(
            path,
            f"{raw_size} bytes decompressed do not fit in memory",
            "free memory or use a larger machine",
        ) from None
    if len(raw) != raw_size:
        raise RunFormatError(
            path,
            f"decompressed to {len(raw)} bytes, the run index declares {raw_size}",
            "the file is damaged",
        )
    header = _parse_header(path, raw, length, len(data))
    _validate_layout(path, header, len(raw) - 8 - length)
    skeleton = _skeleton(path, header)
    try:
        tensors = load_safetensors(raw)  # safetensors: tensors only, never a pickle
        return _unflatten(skeleton, tensors)
    except (KeyError, TypeError, ValueError, RecursionError, safetensors.SafetensorError) as error:
        problem = " ".join(str(error).split())[:200]  # one line, whatever the library said
        raise RunFormatError(
            path,
            f"inconsistent snapshot contents ({error.__class__.__name__}: {problem})",
            "the file is damaged",
        ) from None


def memory_cap() -> int:
    """The most bytes a read may declare: this machine's physical memory."""
    return _memory_cap()


def _memory_cap() -> int:
    """Physical memory: no decode may declare more (a lying header must not trigger a huge
    allocation)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: fall back to a fixed bound
        return 1 << 40
