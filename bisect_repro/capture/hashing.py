"""Content hashes of tensors, computed where the tensors live, many tensors at a time.

:func:`hash_tensors` gives every tensor of a mapping its format-1 digest, defined in
:mod:`bisect_repro.capture.hash_format`; :class:`PendingHashes` is the same in two halves, so that
the work can be queued on the devices now and the digests read later.

Implementation
--------------
Three ways to compute the same two lane sums, chosen per device, and a switch:

- CPU with the C kernel built (:mod:`bisect_repro.capture._hash_cpu`, an optional extension
  compiled at install time): one call per :meth:`PendingHashes.add` hashes every CPU tensor of
  it, large and small, reading each byte once through the tensor's data pointer, vectorised
  (AVX-512 or AVX2, picked at run time), on torch's intra-op threads. Subclasses, quantized
  tensors and lazy conjugate or negative views take the torch-op path, as before.
- CUDA with Triton importable (it ships with CUDA builds of torch): one fused kernel,
  :mod:`bisect_repro.capture._hash_triton`, over every tensor of a call in one launch, reading each
  byte once; lanes are combined per tensor with integer atomics, which are exact in any order.
- Otherwise (no compiler at install, other devices), torch integer ops on the tensor's own device
  (:mod:`bisect_repro.capture._hash_torch`) over cache-sized chunks. Tensors below ``_PACK_WORDS``
  words are packed together (``_PACK_CHUNK`` words at a time) and reduced with one segmented sum,
  so a model's many small tensors cost few ops.
- ``BISECT_REPRO_HASH_BACKEND=torch`` forces the torch-op path everywhere (to rule out the
  kernels); ``=c`` requires the C kernel for CPU tensors (an error where it was not built);
  ``=triton`` forces the Triton kernel everywhere, which on CPU tensors needs Triton's
  interpreter (``TRITON_INTERPRET=1``, how the tests check the kernel without a GPU).

Lanes stay on the device until :meth:`PendingHashes.fetch`, which moves all of them in one
transfer per device; :meth:`PendingHashes.add` never waits for a device. The recorder fetches the
lanes on the training thread (:meth:`PendingHashes.fetch_lanes`) and makes the digests from them
(a BLAKE2b of a short text per tensor) on its writer thread.

Where the guarantees stop: the three paths give the same lanes for every tensor they accept (the
tests hold each to the definition), and a Triton kernel that fails to build or launch is replaced
by the torch-op path with a warning; but work on CUDA is queued on the current stream, so a tensor
written on another stream must be synchronised with it before :meth:`PendingHashes.add` (the
caller's job), and the torch-op path refuses a lazy conjugate view, as it always has.
"""

from __future__ import annotations

import functools
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np
import torch

from . import _hash_cpu, _hash_torch
from .hash_format import MASK32, Entry, digests
from .sketch import SEED as _SKETCH_SEED
from .sketch import WIDTH as _SKETCH_WIDTH

__all__ = ["HostLanes", "PendingHashes", "hash_tensor", "hash_tensors"]

_PACK_WORDS = 1 << 16  # tensors below this many words are packed with others ...
_PACK_CHUNK = 1 << 18  # ... into packs of at most about this many words
_BACKEND = os.environ.get("BISECT_REPRO_HASH_BACKEND", "auto")


class _LanesKernel(Protocol):  # the module _hash_triton, as used here
    def lanes(self, words: Sequence[torch.Tensor]) -> torch.Tensor: ...


_triton_failed = False  # the kernel failed once here: not tried again in this process


@functools.cache
def _triton_kernel() -> _LanesKernel | None:
    """:mod:`._hash_triton` when Triton imports, else ``None``; imported on first use only, since
    importing Triton takes a second and CPU-only runs never need it."""
    try:
        from . import _hash_triton
    except Exception:  # a broken Triton installation must not break hashing: fall back
        return None
    return _hash_triton if _hash_triton.available() else None


def _triton_module() -> _LanesKernel | None:
    """The Triton kernel, unless it is missing or failed once in this process."""
    return None if _triton_failed else _triton_kernel()


def _native_kernel() -> _hash_cpu.Kernel | None:
    """The C kernel for CPU tensors, or ``None`` for the torch-op path (the switch, or not
    built)."""
    if _BACKEND in ("torch", "triton"):
        return None
    kernel = _hash_cpu.load()
    if kernel is None and _BACKEND == "c":
        raise RuntimeError(
            "BISECT_REPRO_HASH_BACKEND=c, but the C hash kernel is not installed "
            f"({_hash_cpu.library_path()} is missing):"
            " reinstall bisect-repro where a C compiler is available, or unset the variable to "
            "hash with torch ops"
        )
    return kernel


_CPU = torch.device("cpu")
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_QUANTIZED = frozenset(
    getattr(torch, name)
    for name in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
    if hasattr(torch, name)
)
_COMPLEX = frozenset((torch.complex32, torch.complex64, torch.complex128))
_AWKWARD = _QUANTIZED | _COMPLEX  # dtypes that take the slower checks of _native_buffer


def _native_buffer(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor as a dense, contiguous CPU tensor whose bytes the C kernel may read, or ``None``
    for a tensor that the torch-op path must take (a subclass, a quantized tensor, or a lazy
    conjugate or negative view, which it refuses as it always has)."""
    if (
        type(tensor) not in _PLAIN
        or tensor.is_neg()
        or tensor.dtype in _QUANTIZED
        or (tensor.dtype in _COMPLEX and tensor.is_conj())
    ):
        return None
    if tensor.layout is not torch.strided:
        tensor = tensor.detach().to_dense()
    if not tensor.is_contiguous():
        tensor = tensor.detach().contiguous()
    return tensor


def _in_place(tensor: torch.Tensor) -> bool:
    """Whether a tensor's bytes are its values where they lie: a plain tensor or parameter, dense,
    contiguous, of an ordinary dtype, not a lazy negation (a model's parameters and optimizer
    states). A few attribute reads: a snapshot asks it of hundreds of tensors."""
    return (
        type(tensor) in _PLAIN
        and tensor.layout is torch.strided
        and tensor.dtype not in _AWKWARD
        and tensor.is_contiguous()
        and not tensor.is_neg()
    )


def _kernel_words(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself where the Triton kernel can read its bytes in place (:func:`_in_place`, of
    whole 4-byte words at a 4-byte aligned address), else :func:`_hash_torch.words_of`'s copy. No
    view is made: a view costs a few microseconds a tensor, and a snapshot hashes hundreds."""
    if _in_place(tensor) and tensor.nbytes % 4 == 0 and tensor.data_ptr() % 4 == 0:
        return tensor
    return _hash_torch.words_of(tensor)


def _uses_kernel(device: torch.device) -> bool:
    if _BACKEND == "torch":
        return False
    if _BACKEND != "triton" and device.type != "cuda":
        return False
    return _triton_module() is not None


def _fused_lanes(words: list[torch.Tensor]) -> torch.Tensor:
    global _triton_failed
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
            warnings.warn(
                f"bisect-repro: the Triton hash kernel failed ({error}); hashing with torch ops "
                "instead",
                stacklevel=4,
            )
            _triton_failed = True
    # the kernel may have been given tensors in place
    words = [_hash_torch.words_of(w) for w in words]
    return torch.cat(
        [
            _hash_torch.lanes_of_large(w).unsqueeze(0)
            if w.numel()
            else w.new_zeros((1, 2), dtype=torch.int64)
            for w in words
        ]
    )


class _NativeBatch:
    """The CPU tensors of one :meth:`PendingHashes.add` for the C kernel, hashed in one call. The
    per-tensor work is kept to a few attribute reads, since a model has hundreds of small tensors;
    the kernel is looked up when the first CPU tensor comes."""

    def __init__(self) -> None:
        self.kernel: _hash_cpu.Kernel | None = None
        self.looked_up = False
        self.entries: list[Entry] = []
        self.buffers: list[torch.Tensor] = []  # kept alive until the kernel returns
        self.pointers: list[int] = []
        self.sizes: list[int] = []
        self.sketch_at: list[int | None] = []

    def take(self, entry: Entry, tensor: torch.Tensor, sketch: Mapping[str, int] | None) -> bool:
        """Whether the C kernel takes this CPU tensor (else the caller hashes it otherwise)."""
        if not self.looked_up:
            self.kernel, self.looked_up = _native_kernel(), True
        if self.kernel is None:
            return False
        buffer = tensor if _in_place(tensor) else _native_buffer(tensor)
        if buffer is None:
            return False
        self.entries.append(entry)
        self.buffers.append(buffer)
        self.pointers.append(buffer.data_ptr())
        self.sizes.append(buffer.nbytes)
        sketched = sketch is not None and entry[1] == torch.float32
        self.sketch_at.append(sketch.get(entry[0]) if sketched and sketch else None)
        return True

    def lanes(self, sketches: dict[str, np.ndarray]) -> torch.Tensor:
        """Every taken tensor's lanes (int64 ``[k, 2]``); the sketches asked for go into
        ``sketches`` by name."""
        assert self.kernel is not None
        if self.kernel.sketches and any(at is not None for at in self.sketch_at):
            lanes, rows = self.kernel.lanes_and_sketches(
                self.pointers, self.sizes, self.sketch_at, _SKETCH_WIDTH, _SKETCH_SEED
            )
            sketches.update(
                (entry[0], row)
                for entry, at, row in zip(self.entries, self.sketch_at, rows, strict=True)
                if at is not None
            )
        else:
            lanes = self.kernel.lanes_of_buffers(self.pointers, self.sizes)
        self.buffers.clear()
        return torch.from_numpy(lanes.astype(np.int64))


class PendingHashes:
    """Hashes enqueued on their devices and fetched later, all together.

    :meth:`add` launches the work and returns at once, with no host-device synchronisation;
    :meth:`fetch` moves every lane sum to the host in one transfer per device.
    """

    def __init__(self) -> None:
        self._entries: dict[torch.device, list[Entry]] = {}
        self._lanes: dict[torch.device, list[torch.Tensor]] = {}
        self._order: list[str] = []
        self._sketches: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._order)

    def add(
        self,
        tensors: Mapping[str, torch.Tensor | np.ndarray],
        sketch: Mapping[str, int] | None = None,
    ) -> None:
        """Hash ``tensors``; and the float32 CPU tensors named in ``sketch`` (by the global index of
        their first element) are sketched in the same pass where the C kernel takes them
        (:attr:`HostLanes.sketches`; the caller sketches the others itself)."""
        fused: dict[torch.device, list[tuple[Entry, torch.Tensor]]] = {}
        small: dict[torch.device, list[tuple[Entry, torch.Tensor]]] = {}
        empty: dict[torch.device, list[Entry]] = {}
        native = _NativeBatch()
        for name, value in tensors.items():
            tensor = (
                torch.from_numpy(np.ascontiguousarray(value))
                if isinstance(value, np.ndarray)
                else value
            )
            entry = (name, tensor.dtype, tensor.shape)
            self._order.append(name)
            if tensor.is_cpu and native.take(entry, tensor, sketch):
                continue
            device = tensor.device
            if _uses_kernel(device):  # every tensor of the device in one launch, below
                fused.setdefault(device, []).append((entry, _kernel_words(tensor)))
                continue
            words = _hash_torch.words_of(tensor)
            if words.numel() == 0:
                empty.setdefault(device, []).append(entry)
            elif words.numel() >= _PACK_WORDS:
                self._push(device, [entry], _hash_torch.lanes_of_large(words).unsqueeze(0))
            else:
                small.setdefault(device, []).append((entry, words))
        if native.entries:
            self._push(_CPU, native.entries, native.lanes(self._sketches))
        for device, items in fused.items():
            self._push(device, [e for e, _ in items], _fused_lanes([w for _, w in items]))
        for device, items in small.items():
            self._push_packed(device, items)
        for device, entries in empty.items():
            zeros = torch.zeros((len(entries), 2), dtype=torch.int64, device=device)
            self._push(device, entries, zeros)

    def _push_packed(self, device: torch.device, items: list[tuple[Entry, torch.Tensor]]) -> None:
        """Small tensors' lanes, ``_PACK_CHUNK`` words at a time by one segmented sum each."""
        batch: list[tuple[Entry, torch.Tensor]] = []
        packed = 0
        for item in [*items, None]:
            if item is None or (batch and packed + item[1].numel() > _PACK_CHUNK):
                lanes = _hash_torch.lanes_of_small([w for _, w in batch])
                self._push(device, [e for e, _ in batch], lanes)
                batch, packed = [], 0
            if item is not None:
                batch.append(item)
                packed += item[1].numel()

    def _push(self, device: torch.device, entries: list[Entry], lanes: torch.Tensor) -> None:
        self._entries.setdefault(device, []).extend(entries)
        self._lanes.setdefault(device, []).append(lanes)

    def fetch(self) -> dict[str, str]:
        """Digests by name, in the order they were added."""
        return self.fetch_lanes().digests()

    def fetch_lanes(self) -> HostLanes:
        """Every lane sum on the host, in one transfer per device: the host synchronisation. The
        digests are made from them afterwards, on any thread (:meth:`HostLanes.digests`)."""
        parts: list[tuple[list[Entry], np.ndarray]] = []
        for device, entries in self._entries.items():
            lanes = self._lanes[device]
            # The Triton kernel's lanes are int32 bit patterns, the other paths' int64 in range:
            # both read as unsigned 32-bit sums here.
            host = (lanes[0] if len(lanes) == 1 else torch.cat(lanes)).cpu().numpy().astype(
                np.int64
            ) & MASK32
            if host.shape != (len(entries), 2):
                raise AssertionError(f"{host.shape[0]} lane pairs for {len(entries)} tensors")
            parts.append((entries, host))
        return HostLanes(parts, self._order, self._sketches)


class HostLanes:
    """The lane sums of a :class:`PendingHashes`, fetched to the host; :meth:`digests` turns them
    into digests (pure host work, a BLAKE2b per tensor, on whichever thread calls it)."""

    def __init__(
        self,
        parts: list[tuple[list[Entry], np.ndarray]],
        order: list[str],
        sketches: dict[str, np.ndarray] | None = None,
    ) -> None:
        self._parts, self._order = parts, order
        self.sketches: dict[str, np.ndarray] = sketches or {}
        """The sketches (float64[WIDTH]) taken in the hash's pass, by name
        (:meth:`PendingHashes.add`)."""

    def digests(self) -> dict[str, str]:
        """Digests by name, in the order they were added."""
        found: dict[str, str] = {}
        for entries, lanes in self._parts:
            names = [entry[0] for entry in entries]
            if len(self._parts) == 1 and names == self._order:  # the common case: already in order
                return dict(zip(names, digests(entries, lanes), strict=True))
            found.update(zip(names, digests(entries, lanes), strict=True))
        return {name: found[name] for name in self._order}


def hash_tensors(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> dict[str, str]:
    """Digest of every tensor, by name, with one host transfer per device."""
    pending = PendingHashes()
    pending.add(tensors)
    return pending.fetch()


def hash_tensor(tensor: torch.Tensor | np.ndarray) -> str:
    """Digest of one tensor (a host synchronisation: prefer :func:`hash_tensors`)."""
    return hash_tensors({"": tensor})[""]
