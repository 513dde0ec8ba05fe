from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
import zstandard

from bisect_repro.errors import RunFormatError
from bisect_repro.store import codec


def roundtrip(tree, tmp_path):
    data, size = codec.encode(tree)
    return codec.decode(data, tmp_path / "f", raw_size=size, digest=codec.checksum(data))


def test_optimizer_and_model_state_round_trip_exactly(tmp_path) -> None:
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.Adam(model.parameters(), betas=(0.8, 0.9))
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    tree = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "dtype": torch.bfloat16,
        "array": np.arange(3),
    }
    back = roundtrip(tree, tmp_path)
    assert back["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)
    assert set(back["optimizer"]["state"]) == {0, 1}
    assert back["dtype"] is torch.bfloat16
    assert np.array_equal(back["array"], np.arange(3))
    for key, value in model.state_dict().items():
        assert torch.equal(back["model"][key], value)
    fresh = torch.optim.Adam(torch.nn.Linear(4, 3).parameters())
    fresh.load_state_dict(back["optimizer"])


def test_reserved_looking_keys_survive(tmp_path) -> None:
    tree = {"__tensor__": "not a reference", "x": [1, {"__tuple__": 2}]}
    assert roundtrip(tree, tmp_path) == tree


def test_objects_that_would_need_pickle_are_refused() -> None:
    with pytest.raises(TypeError, match="pickle"):
        codec.encode({"f": lambda: None})


def test_stored_tensors_do_not_alias_the_training_state(tmp_path) -> None:
    weight = torch.zeros(3)
    data, size = codec.encode({"w": weight})
    weight += 1
    assert torch.equal(codec.decode(data, tmp_path / "f", raw_size=size)["w"], torch.zeros(3))


def _raw(tree) -> bytes:
    data, _ = codec.encode(tree)
    return zstandard.ZstdDecompressor().decompress(data)


def _pack(raw: bytes) -> tuple[bytes, int]:
    return zstandard.ZstdCompressor().compress(raw), len(raw)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda raw: struct.pack("<Q", 10**9) + raw[8:], "exceeds the file"),
        (lambda raw: raw[:8] + b"{" * 4 + raw[12:], "not valid JSON"),
        (lambda raw: raw[:6], "header length"),
    ],
)
def test_damaged_headers_are_named(tmp_path, damage, message) -> None:
    data, size = _pack(damage(_raw({"a": torch.ones(3)})))
    with pytest.raises(RunFormatError, match=message):
        codec.decode(data, tmp_path / "f", raw_size=size)


def _safetensors(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def test_overlapping_offsets_are_refused(tmp_path) -> None:
    header = {
        "__metadata__": {"bisect_repro": "{}"},
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    data, size = _pack(_safetensors(header, bytes(12)))
    with pytest.raises(RunFormatError, match="overlap"):
        codec.decode(data, tmp_path / "f", raw_size=size)


def test_offsets_outside_the_data_are_refused(tmp_path) -> None:
    header = {
        "__metadata__": {"bisect_repro": "{}"},
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
    }
    data, size = _pack(_safetensors(header, bytes(8)))
    with pytest.raises(RunFormatError, match="offsets"):
        codec.decode(data, tmp_path / "f", raw_size=size)


def test_truncated_frames_and_bombs_are_refused(tmp_path) -> None:
    data, size = codec.encode({"a": torch.zeros(100_000)})
    with pytest.raises(RunFormatError, match=r"zstandard|declares"):
        codec.decode(data[: len(data) // 2], tmp_path / "f", raw_size=size)
    with pytest.raises(RunFormatError, match="declares"):
        codec.decode(data, tmp_path / "f", raw_size=1000)  # the index said it was small


def test_checksum_mismatch_is_named(tmp_path) -> None:
    data, size = codec.encode({"a": torch.zeros(3)})
    with pytest.raises(RunFormatError, match="checksum"):
        codec.decode(data, tmp_path / "f", raw_size=size, digest="0" * 32)


def test_a_reused_compressor_writes_the_bytes_of_a_fresh_one() -> None:
    trees = [
        {"a": torch.arange(1000), "n": 1},
        {"b": torch.randn(300), "s": "x" * 50},
        {"a": torch.arange(1000), "n": 1},
    ]
    # each after the others on this thread: no history carries over between files
    for tree in trees:
        data, raw_size = codec.encode(tree)
        raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_size)
        assert data == zstandard.ZstdCompressor(level=codec.level_of(codec.prepare(tree))).compress(
            raw
        )


def test_tensor_heavy_files_take_the_fast_level_and_read_back() -> None:
    big = {"w": torch.randn(400_000), "zeros": torch.zeros(300_000), "step": 3}
    small = {"hashes": {f"layer{i}": "ab" * 16 for i in range(50)}, "w": torch.randn(100)}
    assert codec.level_of(codec.prepare(big)) == codec.TENSOR_LEVEL
    assert codec.level_of(codec.prepare(small)) == codec.LEVEL
    data, raw_size = codec.encode(big)
    raw = zstandard.ZstdDecompressor().decompress(data, max_output_size=raw_size)
    assert data == zstandard.ZstdCompressor(level=codec.TENSOR_LEVEL).compress(raw)
    assert len(data) < raw_size - 1_000_000  # the zeros still shrink at the fast level
    back = codec.decode(data, Path("f"), raw_size=raw_size, digest=codec.checksum(data))
    assert (
        torch.equal(back["w"], big["w"])
        and torch.equal(back["zeros"], big["zeros"])
        and back["step"] == 3
    )
