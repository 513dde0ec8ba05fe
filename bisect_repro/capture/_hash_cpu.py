"""The format-1 tensor hash on the CPU as a compiled C kernel, called through ctypes.

Private to :mod:`bisect_repro.capture.hashing`, which picks it; the hash is defined in
:mod:`bisect_repro.capture.hash_format`, and this module only computes the same two lane sums
faster. The kernel, ``_hash_c.c`` beside this file, is plain C (no Python or torch headers) built
at install time as an optional extension: where it was not built (no C compiler, or a platform it
does not compile on) :func:`load` returns ``None`` and the hash uses torch ops instead, with the
same lanes.

One call hashes a whole batch of tensors: the kernel reads each tensor's bytes once, through its
data pointer, with AVX-512 or AVX2 where the CPU has them (chosen when the call runs, never fixed
at build time). Batches of more than one 256 KiB chunk are shared among ``torch.get_num_threads()``
threads, which take chunks in turn: the threads of torch's own OpenMP runtime where torch uses
one (found at run time among the libraries torch has loaded), else threads started for the call.
Torch's OpenMP threads spin for a while after every torch op, so threads of our own started right
after one would compete with them for the cores (2x slower on two cores, see benchmarks/NOTES.md).
The GIL is released for the call.

Where the guarantees stop: the tensors must be dense, contiguous CPU tensors that stay alive and
unchanged for the call (the caller's job); the lanes are exact for any thread count and chunk
size (sums modulo 2**32), and the tests check every vector level the test machine has, with and
without the OpenMP threads.
"""

from __future__ import annotations

import array
import ctypes
import functools
import os
import re
import sysconfig
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = ["CHUNK_WORDS", "LEVELS", "Kernel", "library_path", "load"]

LEVELS = ("portable", "avx2", "avx512")  # the kernel's vector levels, by number
# 256 KiB handed to a thread at a time: a few microseconds of work, so threads stay balanced
CHUNK_WORDS = 1 << 16
_NAME = "_hash_c"  # the extension's name, beside this file
_NO_SKETCH = (1 << 64) - 1  # a buffer the fused call does not sketch


class Kernel:
    """The C kernel loaded from one shared library."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        library = ctypes.CDLL(str(self.path))  # CDLL releases the GIL for each call
        self._lanes = library.br_hash_lanes
        self._lanes.restype = ctypes.c_int
        self._lanes.argtypes = [
            ctypes.c_size_t,  # count
            ctypes.c_void_p,  # const void *data[count]
            ctypes.c_void_p,  # const uint64_t nbytes[count]
            ctypes.c_void_p,  # uint32_t lanes[count][2], out
            ctypes.c_int,  # threads
            ctypes.c_uint64,  # chunk_words
            ctypes.c_int,  # level, -1 for the best
            # GOMP_parallel of torch's OpenMP runtime, or NULL for threads of its own
            ctypes.c_void_p,
        ]
        # absent from a build older than the fused sketch
        self._fused = getattr(library, "br_hash_sketch", None)
        if self._fused is not None:
            self._fused.restype = ctypes.c_int
            self._fused.argtypes = [
                *self._lanes.argtypes,
                ctypes.c_void_p,
                ctypes.c_uint64,
                ctypes.c_uint64,
                ctypes.c_void_p,
            ]
        best = library.br_hash_best_level
        best.restype = ctypes.c_int
        best.argtypes = []
        self.best_level: int = best()
        self.team: int | None = _torch_openmp_team()

    def lanes(self, tensors: Sequence[torch.Tensor], **options: int | bool | None) -> np.ndarray:
        """Lane sums (uint32[k, 2]) of k dense, contiguous CPU tensors (options:
        :meth:`lanes_of_buffers`)."""
        pointers, sizes = [t.data_ptr() for t in tensors], [t.nbytes for t in tensors]
        return self.lanes_of_buffers(pointers, sizes, **options)  # type: ignore[arg-type]

    @property
    def sketches(self) -> bool:
        """Whether this build sketches in the hash's pass (:meth:`lanes_and_sketches`)."""
        return self._fused is not None

    def lanes_of_buffers(
        self,
        pointers: Sequence[int],
        sizes: Sequence[int],
        *,
        threads: int | None = None,
        chunk_words: int = CHUNK_WORDS,
        level: int = -1,
        use_team: bool = True,
    ) -> np.ndarray:
        """Lane sums (uint32[k, 2]) of k byte buffers given by address and length.

        ``threads`` defaults to torch's intra-op thread count; ``chunk_words``, ``level`` and
        ``use_team`` (torch's OpenMP threads where found, else threads of the kernel's own) exist
        for the tests: odd splits, each vector level, both kinds of threads."""
        return self._call(
            pointers,
            sizes,
            None,
            threads=threads,
            chunk_words=chunk_words,
            level=level,
            use_team=use_team,
        )[0]

    def lanes_and_sketches(
        self,
        pointers: Sequence[int],
        sizes: Sequence[int],
        sketch_at: Sequence[int | None],
        width: int,
        seed: int,
        **options: int | bool | None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`lanes_of_buffers`, and in the same pass the linear sketches (float64[k, width],
        :mod:`bisect_repro.capture.sketch`) of the buffers whose ``sketch_at`` is the global index
        of their first element (float32 buffers only; zeros for those given ``None``)."""
        lanes, sketches = self._call(pointers, sizes, (sketch_at, width, seed), **options)  # type: ignore[arg-type]
        assert sketches is not None
        return lanes, sketches

    def _call(
        self,
        pointers: Sequence[int],
        sizes: Sequence[int],
        sketch: tuple[Sequence[int | None], int, int] | None,
        *,
        threads: int | None = None,
        chunk_words: int = CHUNK_WORDS,
        level: int = -1,
        use_team: bool = True,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        count = len(pointers)
        if len(sizes) != count:
            raise ValueError(f"{count} pointers but {len(sizes)} sizes")
        # cheaper than numpy for a few items
        addresses, lengths = array.array("Q", pointers), array.array("Q", sizes)
        out = array.array("I", bytes(8 * count))
        common = (
            count,
            addresses.buffer_info()[0],
            lengths.buffer_info()[0],
            out.buffer_info()[0],
            torch.get_num_threads() if threads is None else threads,
            max(1, chunk_words),
            level,
            self.team if use_team else None,
        )
        sketches = None
        if sketch is None:
            status = self._lanes(*common)
        else:
            if self._fused is None:
                raise RuntimeError(
                    f"{self.path} was built without the fused sketch: reinstall bisect-repro"
                )
            where, width, seed = sketch
            if len(where) != count:
                raise ValueError(f"{count} pointers but {len(where)} sketch offsets")
            starts = array.array("Q", [_NO_SKETCH if g is None else g for g in where])
            sketches = np.zeros((count, width), dtype=np.float64)
            status = self._fused(
                *common, starts.buffer_info()[0], width, seed, sketches.ctypes.data
            )
        if status == -1:
            raise ValueError(
                f"vector level {level} is not supported by this CPU (best: {self.best_level})"
            )
        if status == -3:
            raise ValueError(
                f"the sketch kernel refused width {sketch[1] if sketch else 0} or seed "
                f"{sketch[2] if sketch else 0}"
            )
        if status != 0:
            raise MemoryError("the hash kernel could not allocate its work tables")
        return np.frombuffer(out, dtype=np.uint32).reshape(count, 2), sketches


def _torch_openmp_team() -> int | None:
    """The address of ``GOMP_parallel`` in the OpenMP runtime that torch runs its intra-op threads
    on, or ``None``: torch built without OpenMP, no ``/proc`` (not Linux), or not exactly one
    runtime to be sure of. libgomp provides it, and so do LLVM's and Intel's runtimes."""
    if not getattr(torch._C, "has_openmp", False):
        return None
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return None
    loaded = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and re.fullmatch(
            r"lib(g|i5?)?omp[-.\w]*\.so[.\d]*", Path(fields[5]).name
        ):
            loaded.add(fields[5])
    # the runtime a torch wheel bundles
    own = [path for path in loaded if Path(path).parent == Path(torch.__file__).parent / "lib"]
    candidates = own or sorted(loaded)
    if len(candidates) != 1:
        return None
    try:
        # already loaded by torch: loads nothing
        runtime = ctypes.CDLL(candidates[0], mode=os.RTLD_NOLOAD | os.RTLD_NOW)
        return ctypes.cast(runtime.GOMP_parallel, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


def library_path() -> Path:
    """Where the installed extension is (or would be)."""
    return Path(__file__).with_name(_NAME + (sysconfig.get_config_var("EXT_SUFFIX") or ".so"))


@functools.cache
def load() -> Kernel | None:
    """The installed kernel, loaded on first use; ``None`` where it was not built or cannot load."""
    path = library_path()
    try:
        return Kernel(path) if path.is_file() else None
    except (OSError, AttributeError) as error:  # built for another platform, or a stale build
        warnings.warn(
            f"bisect-repro: the C hash kernel {path} does not load ({error}); hashing with torch "
            "ops",
            stacklevel=3,
        )
        return None
