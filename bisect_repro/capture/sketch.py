"""Linear sketches of tensors: what lets two runs' weights be measured apart without storing them.

The sketch of a tensor (``WIDTH`` float64 numbers, seed ``SEED``): the element at global flat
index ``g`` (row-major over the tensor's global shape: a DTensor's whole, not its shard) adds
``sign(g) * value`` to bucket ``g % WIDTH``, summed in float64. With ``mix`` splitmix64's
finaliser and ``B = g >> 16`` the element's block: ``sign(g) = s(B) * T[(g % 2**16 + r(B)) %
2**16]``, where ``s(B)`` is -1 when the top bit of ``mix(B ^ SEED)`` is set (else +1), ``r(B)``
its low 16 bits, and ``T[j]`` the same sign of ``mix(j ^ SEED ^ TABLE_KEY)``. Each element has its
own sign (a constant difference does not fall alike into every bucket), and the signs within a
block are read from the table in order, which keeps the kernel a plain multiply-add loop.

Guarantees:
- Linear: ``sketch(x) - sketch(y) = sketch(x - y)``; and keyed by the global index, so the
  sketches of a tensor's shards, each taken with its own global indices, add up to the sketch of
  the whole tensor: a sharded run and an unsharded one compare.
- ``|sketch(x) - sketch(y)|`` estimates ``|x - y|`` (L2), its square without bias (the signs of
  distinct elements are uncorrelated). Its relative error is about ``sqrt(1 / (2 * WIDTH))`` (6%)
  for a difference spread over many elements (:func:`relative_error_bound` is what the tests hold
  it to).
- Computed where the tensor lives: on the CPU by the C kernel beside the hash's (float32, float64
  sums, AVX2 where the CPU has it), elsewhere by torch ops on the tensor's device; one transfer per
  device. A snapshot's plain float32 CPU parameters are sketched in the hash's own pass over them
  (:func:`fusable`, :meth:`~bisect_repro.capture.hashing.PendingHashes.add`): each 256 KiB piece
  is sketched right after it is hashed, while it is in the cache, on the hash's threads, into
  partial sums of its own that are added in order at the end, so the sums do not depend on the
  thread count. Alone (activations, and tensors the hash pass does not take) one thread sketches.

Where the guarantees stop: an estimate, not a distance: a difference held by a few elements whose
global indices share a bucket is over- or under-estimated more (the exact distance from
checkpoints is the check); float64 sums taken in another order (the C kernel against torch ops,
shards added, the hash's pieces) agree to about 1e-16 relative, not bit for bit; only
floating-point parameters are sketched, not buffers or optimizer states.
"""

from __future__ import annotations

import array
import ctypes
import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import torch

from . import _hash_cpu

__all__ = [
    "SEED",
    "TABLE_KEY",
    "WIDTH",
    "PendingSketches",
    "fusable",
    "queue_sketches",
    "relative_error_bound",
    "signs",
    "sketch_flat",
    "sketch_indexed",
    "sketch_tensors",
]

WIDTH = 128
TABLE_KEY = 0x7AB1E5
_BLOCK_BITS = 16
_BLOCK = 1 << _BLOCK_BITS
_PLAIN = (torch.Tensor, torch.nn.Parameter)
SEED = 0x5EC7C0DE
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _signed(value: int) -> int:
    """A 64-bit pattern as the int64 torch holds it."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _shift(z: torch.Tensor, bits: int) -> torch.Tensor:
    """``z >> bits`` as on an unsigned 64-bit integer (torch shifts int64 arithmetically)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser of ``z + GOLDEN``, on int64 holding the unsigned values."""
    z = z + _signed(_GOLDEN)
    z = (z ^ _shift(z, 30)) * _signed(_MIX1)
    z = (z ^ _shift(z, 27)) * _signed(_MIX2)
    return z ^ _shift(z, 31)


@functools.cache
def _table(device: torch.device) -> torch.Tensor:
    """``T`` (float64[2**16] of +-1) on a device."""
    z = _mix(torch.arange(_BLOCK, dtype=torch.int64) ^ (SEED ^ TABLE_KEY))
    return torch.where(z < 0, -1.0, 1.0).to(torch.float64).to(device)


def signs(indices: torch.Tensor) -> torch.Tensor:
    """``sign(g)`` (float64, +-1) of each global index, on the indices' device."""
    z = _mix((indices >> _BLOCK_BITS) ^ SEED)
    slots = ((indices & (_BLOCK - 1)) + (z & (_BLOCK - 1))) & (_BLOCK - 1)
    return torch.where(z < 0, -1.0, 1.0).to(torch.float64) * _table(indices.device)[slots]


def sketch_flat(values: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """The sketch (float64[WIDTH], on the values' device) of a tensor whose element i (flat,
    row-major) has the global index ``offset + i``, by torch ops."""
    return sketch_indexed(
        values,
        torch.arange(offset, offset + values.numel(), device=values.device, dtype=torch.int64),
    )


def sketch_indexed(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """The sketch of values at arbitrary global indices (int64, same shape), by torch ops."""
    values, indices = values.detach().reshape(-1).to(torch.float64), indices.reshape(-1)
    return values.new_zeros(WIDTH).index_add_(0, indices % WIDTH, values * signs(indices))


def _global_indices(
    shape: list[int], local_shape: list[int], offsets: list[int], device: torch.device
) -> torch.Tensor:
    """The global flat index of every element of a local block (row-major) of a tensor of
    ``shape``."""
    index = torch.zeros((), dtype=torch.int64, device=device)
    stride = 1
    for size, local, start in reversed(list(zip(shape, local_shape, offsets, strict=True))):
        axis = torch.arange(start, start + local, device=device, dtype=torch.int64) * stride
        index = axis.reshape([local] + [1] * index.dim()) + index
        stride *= size
    return index


def _local_block(tensor: torch.Tensor) -> tuple[torch.Tensor, int | None, torch.Tensor | None]:
    """A tensor's local values with where they sit in the whole: a contiguous global range from
    ``offset``, else (a shard along an inner dimension) every element's global index."""
    to_local = getattr(tensor, "to_local", None)
    if to_local is None:
        return tensor, 0, None
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local = to_local()
    shape = list(tensor.shape)
    mesh, placed = tensor.device_mesh, tensor.placements  # type: ignore[attr-defined]
    local_shape, offsets = (
        list(v) for v in compute_local_shape_and_global_offset(tensor.shape, mesh, placed)
    )
    if local_shape[1:] == shape[1:] and all(o == 0 for o in offsets[1:]):
        return local, offsets[0] * math.prod(shape[1:]), None
    return local, None, _global_indices(shape, local_shape, offsets, local.device)


@functools.cache
def _kernel() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``br_sketch_f32`` of the C kernel, or ``None`` (not built, or built before it had one)."""
    kernel = _hash_cpu.load()
    function = (
        getattr(ctypes.CDLL(str(kernel.path)), "br_sketch_f32", None)
        if kernel is not None
        else None
    )
    if function is not None:
        function.restype = ctypes.c_int
        pointer, count = ctypes.c_void_p, ctypes.c_uint64
        function.argtypes = [ctypes.c_size_t, pointer, pointer, pointer, count, count, pointer]
    return function


def _native(items: list[tuple[torch.Tensor, int]]) -> torch.Tensor:
    """Sketches (float64[len(items), WIDTH]) of dense float32 CPU tensors at global offsets, by the
    C kernel."""
    out = torch.zeros((len(items), WIDTH), dtype=torch.float64)
    pointers, sizes, offsets = (
        array.array("Q", v)
        for v in zip(*[(t.data_ptr(), t.numel(), o) for t, o in items], strict=True)
    )
    kernel = _kernel()
    assert kernel is not None
    status = kernel(
        len(items),
        pointers.buffer_info()[0],
        sizes.buffer_info()[0],
        offsets.buffer_info()[0],
        WIDTH,
        SEED,
        out.data_ptr(),
    )
    if status != 0:
        raise AssertionError(f"the sketch kernel returned {status}")
    return out


@dataclass(frozen=True)
class PendingSketches:
    """Sketches computed where their tensors live and not yet fetched: building one never waits
    for a device; :meth:`fetch` makes the one transfer per device."""

    names: list[str]
    host: torch.Tensor
    """float64[len(names), WIDTH]: the rows computed on the CPU, zeros where a device's go."""
    queued: list[tuple[list[int], torch.Tensor]]
    """Per device: the rows, and their sketches stacked on that device."""
    later: list[tuple[int, torch.Tensor, int]] = field(default_factory=list)
    """Private CPU copies (row, values, global offset) whose sketches :meth:`fetch` computes."""

    def transfer(self) -> None:
        """The one transfer per device (a host synchronisation where a device computed some)."""
        for rows, values in self.queued:
            self.host[rows] = values.cpu()
        self.queued.clear()

    def fetch(self) -> torch.Tensor:
        """float64[len(names), WIDTH] on the CPU: :meth:`transfer`, and the private copies' sketches
        (by the C kernel, on the calling thread: the recorder's writer)."""
        self.transfer()
        if self.later:
            self.host[[row for row, _, _ in self.later]] = _native(
                [(t, o) for _, t, o in self.later]
            )
            self.later.clear()
        return self.host


def fusable(
    tensors: Mapping[str, torch.Tensor], hashed: Mapping[str, torch.Tensor]
) -> dict[str, int]:
    """The tensors among ``tensors`` that the hash's C kernel can sketch in its pass over ``hashed``
    (:meth:`~bisect_repro.capture.hashing.PendingHashes.add`): plain float32 CPU tensors, dense and
    contiguous, hashed as they are (the same tensor under the same name); each at global index 0."""
    return {
        name: 0
        for name, tensor in tensors.items()
        if type(tensor) in _PLAIN
        and tensor.dtype == torch.float32
        and tensor.is_cpu
        and tensor.is_contiguous()
        and hashed.get(name) is tensor
    }


def queue_sketches(
    tensors: Mapping[str, torch.Tensor],
    computed: Mapping[str, np.ndarray] | None = None,
    private: bool = False,
) -> PendingSketches:
    """The sketches of the floating-point tensors among ``tensors``, each computed where the tensor
    lives (a DTensor's from its local shard at its global indices), fetched later; ``computed``:
    sketches already taken (float64[WIDTH] arrays, by name: the hash's pass), used as they are;
    ``private``: the tensors are copies that nothing else writes (activation samples), so the C
    kernel's sketches of those on the CPU wait for :meth:`PendingSketches.fetch`."""
    names: list[str] = []
    native: list[tuple[int, torch.Tensor, int]] = []
    others: list[tuple[int, torch.Tensor]] = []
    done: list[tuple[int, np.ndarray]] = []
    for name, tensor in tensors.items():
        if not tensor.is_floating_point():
            continue
        row = len(names)
        names.append(name)
        if computed is not None and name in computed:
            done.append((row, computed[name]))
            continue
        local, offset, indices = _local_block(tensor.detach())
        plain = (
            local.dtype == torch.float32
            and local.is_cpu
            and local.is_contiguous()
            and type(local) in _PLAIN
        )
        if plain and offset is not None and _kernel() is not None:
            native.append((row, local, offset))
        else:
            others.append(
                (
                    row,
                    sketch_indexed(local, indices)
                    if indices is not None
                    else sketch_flat(local, offset or 0),
                )
            )
    host = torch.zeros((len(names), WIDTH), dtype=torch.float64)
    if done:
        host[[row for row, _ in done]] = torch.as_tensor(
            np.stack([values for _, values in done]), dtype=torch.float64
        )
    if native and not private:
        host[[row for row, _, _ in native]] = _native([(t, o) for _, t, o in native])
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for row, values in others:
        by_device.setdefault(values.device, []).append((row, values))
    queued = [
        ([row for row, _ in items], torch.stack([values for _, values in items]))
        for items in by_device.values()
    ]
    return PendingSketches(names, host, queued, native if private else [])


def sketch_tensors(
    tensors: Mapping[str, torch.Tensor], computed: Mapping[str, np.ndarray] | None = None
) -> tuple[list[str], torch.Tensor]:
    """The names of the floating-point tensors among ``tensors`` and their sketches
    (float64[n, WIDTH] on the CPU): :func:`queue_sketches`, fetched at once."""
    pending = queue_sketches(tensors, computed)
    return pending.names, pending.fetch()


def relative_error_bound(sigmas: float = 4.0) -> float:
    """How far the sketched distance may be from the exact one, relative, at ``sigmas`` standard
    deviations, for a difference spread over many more elements than ``WIDTH``."""
    return sigmas * math.sqrt(1.0 / (2 * WIDTH))
