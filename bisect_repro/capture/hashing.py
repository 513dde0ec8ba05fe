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
Three ways to compute the same two lane sums, chosen per device, and a switch:

- CPU with the C kernel built (:mod:`bisect_repro.capture._hash_cpu`, an optional extension
  compiled at install time): one call per :meth:`PendingHashes.add` hashes every CPU tensor of
  it, large and small, reading each byte once through the tensor's data pointer, vectorised
  (AVX-512 or AVX2, picked at run time), on torch's intra-op threads. Subclasses, quantized
  tensors and lazy conjugate or negative views take the torch-op path, as before.
- CUDA with Triton importable (it ships with CUDA builds of torch): one fused kernel,
  :mod:`bisect_repro.capture._hash_triton`, over every tensor of a call in one launch, reading each byte
  once; lanes are combined per tensor with integer atomics, which are exact in any order.
- Otherwise (no compiler at install, other devices), torch integer ops on the tensor's own device
  (wrapping int32 arithmetic, logical shifts emulated by masking) over cache-sized chunks, in place
  in two scratch buffers so that the 16 passes a chunk needs stay in cache; torch spreads each op
  over the intra-op threads. Tensors below ``_PACK_WORDS`` words are packed together
  (``_PACK_CHUNK`` words at a time) and reduced with one segmented sum, so a model's many small
  tensors cost few ops.
- ``BISECT_REPRO_HASH_BACKEND=torch`` forces the torch-op path everywhere (to rule out the
  kernels); ``=c`` requires the C kernel for CPU tensors (an error where it was not built);
  ``=triton`` forces the Triton kernel everywhere, which on CPU tensors needs Triton's
  interpreter (``TRITON_INTERPRET=1``, how the tests check the kernel without a GPU).

Lanes stay on the device until :meth:`PendingHashes.fetch`, which moves all of them in one
transfer per device; :meth:`PendingHashes.add` never waits for a device.
"""

from __future__ import annotations

import hashlib
import os
import threading
import warnings
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from . import _hash_cpu

__all__ = ["PendingHashes", "digest_of", "hash_tensor", "hash_tensors"]

_POSITION_STEP = 0x9E3779B1
_POSITION_SEED = 0x7F4A7C15
_MIX1 = 0x85EBCA6B
_MIX2 = 0xC2B2AE35
_MASK32 = 0xFFFFFFFF
# 256 Ki words (1 MiB) per chunk: the two 1 MiB scratch buffers stay in the two cores' L2, and a
# chunk is big enough that the per-op dispatch cost (a few microseconds) is small next to the work.
_CHUNK_WORDS = 1 << 18
_PACK_WORDS = 1 << 16  # tensors below this many words are packed with others ...
_PACK_CHUNK = 1 << 18  # ... into packs of at most about this many words
_BACKEND = os.environ.get("BISECT_REPRO_HASH_BACKEND", "auto")


def _signed32(value: int) -> int:
    value &= _MASK32
    return value - (1 << 32) if value >= 1 << 31 else value


_LOCK = threading.Lock()  # the caches below may be filled from several threads
_KEYS_CACHE: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}
_PACK_CACHE: dict[tuple[torch.device, tuple[int, ...]], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


class _LanesKernel(Protocol):  # the module _hash_triton, as used here
    def lanes(self, words: Sequence[torch.Tensor]) -> torch.Tensor: ...


_TRITON: list[_LanesKernel | None] = []
_NATIVE: list[_hash_cpu.Kernel | None] = []  # the C kernel, or None where it was not built; loaded on first use


def _triton_module() -> _LanesKernel | None:
    """:mod:`._hash_triton` when Triton imports, else ``None``; imported on first use only, since
    importing Triton takes a second and CPU-only runs never need it."""
    if not _TRITON:
        try:
            from . import _hash_triton
        except Exception:  # a broken Triton installation must not break hashing: fall back
            _TRITON.append(None)
        else:
            _TRITON.append(_hash_triton if _hash_triton.available() else None)
    return _TRITON[0]


def _native_kernel() -> _hash_cpu.Kernel | None:
    """The C kernel for CPU tensors, or ``None`` for the torch-op path (the switch, or not built)."""
    if _BACKEND in ("torch", "triton"):
        return None
    if not _NATIVE:
        _NATIVE.append(_hash_cpu.load())
    kernel = _NATIVE[0]
    if kernel is None and _BACKEND == "c":
        raise RuntimeError(
            f"BISECT_REPRO_HASH_BACKEND=c, but the C hash kernel is not installed ({_hash_cpu.library_path()} is missing):"
            " reinstall bisect-repro where a C compiler is available, or unset the variable to hash with torch ops"
        )
    return kernel


_CPU = torch.device("cpu")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_QUANTIZED = frozenset(getattr(torch, name) for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4") if hasattr(torch, name))
_COMPLEX = frozenset((torch.complex32, torch.complex64, torch.complex128))
_AWKWARD = _QUANTIZED | _COMPLEX  # dtypes that take the slower checks of _native_buffer


def _native_buffer(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as a dense, contiguous CPU tensor whose bytes the C kernel may read, or ``None``
    for a tensor that the torch-op path must take (a subclass, a quantized tensor, or a lazy
    conjugate or negative view, which it refuses as it always has)."""
    if type(tensor) not in _PLAIN or tensor.is_neg() or tensor.dtype in _QUANTIZED or (tensor.dtype in _COMPLEX and tensor.is_conj()):
        return None
    if tensor.layout is not torch.strided:
        tensor = tensor.detach().to_dense()
    if not tensor.is_contiguous():
        tensor = tensor.detach().contiguous()
    return tensor


def _uses_kernel(device: torch.device) -> bool:
    if _BACKEND == "torch":
        return False
    if _BACKEND != "triton" and device.type != "cuda":
        return False
    return _triton_module() is not None


def _position_keys(device: torch.device, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Position keys ``p`` and ``p | 1`` of words ``0 .. count`` as wrapped int32, cached per device.

    A chunk starting at word ``s`` adds ``s * STEP``; ``s`` is even, so ``p | 1`` is shifted the
    same way (the low bit of ``p`` depends only on ``i``'s parity)."""
    key = (device, count)
    cached = _KEYS_CACHE.get(key)
    if cached is None:
        wide = torch.arange(count, dtype=torch.int64) * _POSITION_STEP + _POSITION_SEED
        keys = (wide & _MASK32).to(torch.int32)  # int64 -> int32 keeps the low 32 bits
        cached = (keys.to(device), (keys | 1).to(device))
        with _LOCK:
            if len(_KEYS_CACHE) >= 16:
                _KEYS_CACHE.clear()
            _KEYS_CACHE[key] = cached
    return cached


def _words(tensor: torch.Tensor, *, align: int = 4) -> torch.Tensor:
    """The tensor's bytes as a flat int32 tensor, zero-padded to whole words.

    A copy only where needed: non-contiguous views, a byte count that is not a multiple of four,
    or a data pointer that is not a multiple of ``align`` bytes."""
    flat = tensor.detach()
    if flat.layout != torch.strided:
        flat = flat.to_dense()
    flat = flat.contiguous().reshape(-1)
    if flat.numel() <= 1 and flat.stride(0) != 1:  # "contiguous" with a stride: torch ignores the strides of size-1 and empty dims
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
        kept = (torch.empty(_CHUNK_WORDS, dtype=torch.int32), torch.empty(_CHUNK_WORDS, dtype=torch.int32))
        _SCRATCH.buffers = kept
    return kept[0][:size], kept[1][:size]


def _xorshift_right(x: torch.Tensor, shift: int, scratch: torch.Tensor) -> None:
    """``x ^= x >>> shift`` in place on int32: torch's ``>>`` is arithmetic, so mask the sign copies."""
    torch.bitwise_right_shift(x, shift, out=scratch)
    scratch.bitwise_and_((1 << (32 - shift)) - 1)
    x.bitwise_xor_(scratch)


def _mix_in_place(x: torch.Tensor, scratch: torch.Tensor) -> None:
    """murmur3's finaliser on int32 words, in place (multiplication wraps like uint32)."""
    _xorshift_right(x, 16, scratch)
    x.mul_(_signed32(_MIX1))
    _xorshift_right(x, 13, scratch)
    x.mul_(_signed32(_MIX2))
    _xorshift_right(x, 16, scratch)


def _sum32(x: torch.Tensor) -> torch.Tensor:
    """The sum of int32 terms; only its value modulo 2**32 is used.

    On the CPU the int32 accumulator wraps exactly like uint32 and sums at twice the speed of an
    int64 one; elsewhere int64, whose low 32 bits are the same."""
    return x.sum(dtype=torch.int32 if x.device.type == "cpu" else torch.int64)


def _lanes_of_large(words: torch.Tensor, *, host_sums: bool | None = None) -> torch.Tensor:
    """Lane sums (int64[2], on the device) of one flat int32 tensor, a chunk at a time.

    A chunk at word ``s`` has position keys ``p = keys + s * STEP`` and ``p | 1 = odd_keys + s * STEP``,
    so its lane 1 is ``sum(x * odd_keys) + s * STEP * sum(x)``: one op fewer than forming ``p | 1``.
    (``p | 1 = odd_keys + s * STEP`` needs ``s * STEP`` even, that is ``s`` even.)
    Every op but the first (the one read of the tensor) works in place on a cache-sized buffer.
    ``host_sums`` (default: on the CPU) accumulates in Python integers, else on the device.
    """
    device = words.device
    on_cpu = device.type == "cpu" if host_sums is None else host_sums
    chunk_words = _CHUNK_WORDS & ~1  # chunks must start at even words (see above)
    size = min(chunk_words, words.numel())
    keys, odd_keys = _position_keys(device, chunk_words)  # one table per device, sliced for shorter tensors
    x, scratch = _scratch(device, size)
    lane0 = lane1 = 0
    parts: list[torch.Tensor] = []
    for start in range(0, words.numel(), size):
        chunk = words[start : start + size]
        n = chunk.numel()
        xn = x[:n]
        offset = (start * _POSITION_STEP) & _MASK32
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
            parts.append(torch.stack([sum0, sum1.to(torch.int64) + (sum0 & _MASK32) * offset]))
    if on_cpu:
        return torch.tensor([lane0 & _MASK32, lane1 & _MASK32], dtype=torch.int64)
    return torch.stack(parts).sum(0) & _MASK32


def _pack_layout(device: torch.device, sizes: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Position keys ``p`` and ``p | 1`` within each packed tensor, and each segment's first word."""
    key = (device, sizes)
    cached = _PACK_CACHE.get(key)
    if cached is None:
        lengths = torch.tensor(sizes, dtype=torch.int64)
        starts = torch.cumsum(lengths, 0) - lengths
        index = torch.arange(int(lengths.sum()), dtype=torch.int64) - torch.repeat_interleave(starts, lengths)
        positions = ((index * _POSITION_STEP + _POSITION_SEED) & _MASK32).to(torch.int32)
        cached = (positions.to(device), (positions | 1).to(device), starts.to(device))
        with _LOCK:
            if len(_PACK_CACHE) >= 64:  # a model has a few layouts; a stream of new ones must not grow this
                _PACK_CACHE.clear()
            _PACK_CACHE[key] = cached
    return cached


def _segment_sums(terms: torch.Tensor, starts: torch.Tensor, *, numpy: bool | None = None) -> torch.Tensor:
    """Sums (int64, modulo 2**32) of the consecutive non-empty segments of int32 ``terms``.

    ``numpy`` (default: on the CPU) uses numpy's segmented sum, else a device cumsum."""
    if terms.device.type == "cpu" if numpy is None else numpy:  # one pass, wrapping in uint32, no int64 copy
        sums = np.add.reduceat(terms.numpy().view(np.uint32), starts.numpy(), dtype=np.uint32)
        return torch.from_numpy(sums.astype(np.int64))
    running = torch.cat([terms.new_zeros(1, dtype=torch.int64), torch.cumsum(terms, 0, dtype=torch.int64)])
    ends = torch.cat([starts[1:], starts.new_tensor([terms.numel()])])
    return (running[ends] - running[starts]) & _MASK32


def _lanes_of_small(group: list[torch.Tensor], *, numpy: bool | None = None) -> torch.Tensor:
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


def _fused_lanes(words: list[torch.Tensor]) -> torch.Tensor:
    """Lane sums (int64[k, 2]) of k word tensors of one device by the Triton kernel.

    If the kernel cannot be built or launched there (an odd toolchain or device), it warns once,
    stops using the kernel and takes the torch-op path, which gives the same lanes."""
    kernel = _triton_module()
    if kernel is not None:
        try:
            return kernel.lanes(words)
        except Exception as error:  # Triton raises many types; any of them means "use the fallback"
            if _BACKEND == "triton":
                raise
            warnings.warn(f"bisect-repro: the Triton hash kernel failed ({error}); hashing with torch ops instead", stacklevel=4)
            _TRITON[:] = [None]
    return torch.cat([_lanes_of_large(w).unsqueeze(0) if w.numel() else w.new_zeros((1, 2), dtype=torch.int64) for w in words])


def digest_of(dtype: torch.dtype | str, shape: tuple[int, ...] | list[int], lane0: int, lane1: int) -> str:
    """Combine two lane sums with the dtype and shape into the 16-hex-digit digest."""
    name = str(dtype).removeprefix("torch.")
    text = f"{name}|{','.join(str(int(d)) for d in shape)}|{lane0:08x}{lane1:08x}"
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


_Entry = tuple[str, torch.dtype, torch.Size]  # name, dtype, shape: a plain tuple, the cheapest record per tensor
_PREFIXES: dict[tuple[torch.dtype, torch.Size], bytes] = {}


def _digests(entries: list[_Entry], lanes: np.ndarray) -> list[str]:
    """:func:`digest_of` of many tensors: the same text, built with less work per tensor.

    ``lanes``: int64[k, 2], each in [0, 2**32). The ``dtype|shape|`` prefixes are cached, since a
    model hashes the same few of them at every snapshot, and the 16 hex digits of every tensor's
    lanes come from one conversion."""
    hex_lanes = lanes.astype(">u4").tobytes().hex().encode()
    blake2b = hashlib.blake2b
    found = []
    for k, (_, dtype, shape) in enumerate(entries):
        prefix = _PREFIXES.get((dtype, shape))
        if prefix is None:
            prefix = f"{str(dtype).removeprefix('torch.')}|{','.join(str(int(d)) for d in shape)}|".encode()
            if len(_PREFIXES) >= 4096:  # a stream of new shapes must not grow this without bound
                _PREFIXES.clear()
            _PREFIXES[dtype, shape] = prefix
        found.append(blake2b(prefix + hex_lanes[16 * k : 16 * k + 16], digest_size=8).hexdigest())
    return found


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
        fused: dict[torch.device, list[tuple[_Entry, torch.Tensor]]] = {}
        small: dict[torch.device, list[tuple[_Entry, torch.Tensor]]] = {}
        empty: dict[torch.device, list[_Entry]] = {}
        # CPU tensors for the C kernel, all in one call: the per-tensor work here is kept to a few
        # attribute reads, since a model has hundreds of small tensors.
        native: _hash_cpu.Kernel | None = None
        looked_up = False  # the kernel is not looked up until a CPU tensor comes
        native_entries: list[_Entry] = []
        buffers: list[torch.Tensor] = []  # kept alive until the kernel returns
        pointers: list[int] = []
        sizes: list[int] = []
        strided = torch.strided
        for name, value in tensors.items():
            tensor = torch.from_numpy(np.ascontiguousarray(value)) if isinstance(value, np.ndarray) else value
            dtype = tensor.dtype
            entry = (name, dtype, tensor.shape)
            self._order.append(name)
            if tensor.is_cpu:
                if not looked_up:
                    native, looked_up = _native_kernel(), True
                if native is not None:
                    plain = type(tensor) in _PLAIN and dtype not in _AWKWARD and tensor.layout is strided
                    buffer = tensor if plain and tensor.is_contiguous() and not tensor.is_neg() else _native_buffer(tensor)
                    if buffer is not None:
                        native_entries.append(entry)
                        buffers.append(buffer)
                        pointers.append(buffer.data_ptr())
                        sizes.append(buffer.nbytes)
                        continue
            device = tensor.device
            if _uses_kernel(device):  # every tensor of the device in one launch, below
                fused.setdefault(device, []).append((entry, _words(tensor)))
                continue
            words = _words(tensor)
            if words.numel() == 0:
                empty.setdefault(device, []).append(entry)
            elif words.numel() >= _PACK_WORDS:
                self._push(device, [entry], _lanes_of_large(words).unsqueeze(0))
            else:
                small.setdefault(device, []).append((entry, words))
        if native is not None and native_entries:
            lanes = native.lanes_of_buffers(pointers, sizes)
            del buffers
            self._push(_CPU, native_entries, torch.from_numpy(lanes.astype(np.int64)))
        for device, items in fused.items():
            self._push(device, [e for e, _ in items], _fused_lanes([w for _, w in items]))
        for device, items in small.items():
            batch: list[tuple[_Entry, torch.Tensor]] = []
            packed = 0
            for item in [*items, None]:
                if item is None or (batch and packed + item[1].numel() > _PACK_CHUNK):
                    self._push(device, [e for e, _ in batch], _lanes_of_small([w for _, w in batch]))
                    batch, packed = [], 0
                if item is not None:
                    batch.append(item)
                    packed += item[1].numel()
        for device, entries in empty.items():
            self._push(device, entries, torch.zeros((len(entries), 2), dtype=torch.int64, device=device))

    def _push(self, device: torch.device, entries: list[_Entry], lanes: torch.Tensor) -> None:
        self._entries.setdefault(device, []).extend(entries)
        self._lanes.setdefault(device, []).append(lanes)

    def fetch(self) -> dict[str, str]:
        """Digests by name, in the order they were added."""
        found: dict[str, str] = {}
        for device, entries in self._entries.items():
            parts = self._lanes[device]
            lanes = (parts[0] if len(parts) == 1 else torch.cat(parts)).cpu().numpy()
            if lanes.shape != (len(entries), 2):
                raise AssertionError(f"{lanes.shape[0]} lane pairs for {len(entries)} tensors")
            names = [entry[0] for entry in entries]
            if len(self._entries) == 1 and names == self._order:  # the common case: already in order
                return dict(zip(names, _digests(entries, lanes), strict=True))
            found.update(zip(names, _digests(entries, lanes), strict=True))
        return {name: found[name] for name in self._order}


def hash_tensors(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, str]:
    """Digest of every tensor, by name, with one host transfer per device."""
    pending = PendingHashes()
    pending.add(tensors)
    return pending.fetch()


def hash_tensor(tensor: torch.Tensor | np.ndarray) -> str:
    """Digest of one tensor (a host synchronisation: prefer :func:`hash_tensors`)."""
    return hash_tensors({"": tensor})[""]
