"""A file made in one pass holds safetensors' own bytes for the same tensors, whatever their dtypes
and shapes; its size and checksum are those of what was written; a write cut short leaves
nothing."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import safetensors.torch
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from bisect_repro.errors import UnstorableError
from bisect_repro.store import codec, encoding
from bisect_repro.store.anchor import Folder

DTYPES = {name: dtype for dtype, name in encoding._NAMES.items()}


def test_every_dtype_safetensors_names_is_in_its_order() -> None:
    assert sorted(DTYPES) == sorted(encoding.SAFETENSORS_ORDER)


@st.composite
def tensors(draw: st.DrawFn) -> dict[str, torch.Tensor]:
    count = draw(st.integers(0, 6))
    found: dict[str, torch.Tensor] = {}
    for _ in range(count):
        name = draw(
            st.text(
                st.characters(codec=("utf-8"), exclude_categories=("Cs",)), min_size=1, max_size=8
            )
        )
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        dtype = DTYPES[draw(st.sampled_from(encoding.SAFETENSORS_ORDER))]
        size = int(torch.tensor(shape).prod()) * torch.empty((), dtype=dtype).element_size()
        data = draw(st.binary(min_size=size, max_size=size))
        found[name] = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)
            if size
            else torch.zeros(shape, dtype=dtype)
        )
    return found


@settings(max_examples=150, deadline=None)
@given(found=tensors(), skeleton=st.text(max_size=40))
def test_the_uncompressed_file_is_byte_for_byte_what_safetensors_saves(
    found: dict[str, torch.Tensor], skeleton: str
) -> None:
    made = encoding.Encoding(skeleton, found, level=encoding.LEVEL)
    data = b"".join(made)
    raw = zstandard.ZstdDecompressor().decompress(data)
    assert raw == safetensors.torch.save(found, metadata={"bisect_repro": skeleton})
    assert (made.size, made.raw_size, made.checksum) == (len(data), len(raw), codec.checksum(data))
    # the reader refuses a frame that does not declare it
    assert zstandard.frame_content_size(data) == len(raw)


def test_a_large_file_comes_in_chunks_and_reads_back_as_its_tree() -> None:
    tree = {
        "w": torch.randn(700_000),
        "b": torch.zeros(3, 5, dtype=torch.bfloat16),
        "scalar": torch.tensor(2.5),
        "step": 7,
    }
    made = codec.encoding_of(codec.prepare(tree))
    chunks = list(made)
    assert len(chunks) > 1 and all(len(chunk) == encoding.CHUNK for chunk in chunks[:-1])
    back = codec.decode(b"".join(chunks), Path("f"), raw_size=made.raw_size, digest=made.checksum)
    assert all(torch.equal(back[k], tree[k]) for k in ("w", "b", "scalar")) and back["step"] == 7


def test_an_encoding_is_made_once_and_its_checksum_known_only_at_its_end() -> None:
    made = codec.encoding_of(codec.prepare({"w": torch.arange(10)}))
    with pytest.raises(RuntimeError, match="once it has been iterated"):
        _ = made.checksum
    chunks = iter(made)
    next(chunks)
    with pytest.raises(RuntimeError, match="once it has been iterated"):
        _ = made.checksum
    with pytest.raises(RuntimeError, match="iterated once"):
        list(made)


def test_a_dtype_safetensors_cannot_name_is_refused_with_its_key() -> None:
    with pytest.raises(UnstorableError, match=r"state tensor 0: a torch.complex128 tensor"):
        codec.encode({"z": torch.zeros(2, dtype=torch.complex128)})


def test_a_file_whose_writing_fails_half_way_is_removed(tmp_path: Path) -> None:
    def chunks():
        yield b"first"
        raise OSError(errno.ENOSPC, "No space left on device")

    with Folder.open(tmp_path) as folder, pytest.raises(OSError):
        folder.create("f", chunks())
    assert list(tmp_path.iterdir()) == []


def test_a_file_is_created_from_bytes_of_any_kind_or_from_chunks(tmp_path: Path) -> None:
    with Folder.open(tmp_path) as folder:
        for name, data in (
            ("a", b"whole"),
            ("b", bytearray(b"whole")),
            ("c", memoryview(b"whole")),
            ("d", iter([b"who", b"le"])),
        ):
            folder.create(name, data)
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == dict.fromkeys(
        "abcd", b"whole"
    )
