from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from bisect_repro.capture.rng import RandomStreams, tree_digest
from bisect_repro.errors import BisectReproError
from bisect_repro.store import codec


def draws(extra: dict[str, object]) -> list[object]:
    out: list[object] = [
        random.random(),
        random.gauss(0, 1),
        float(np.random.rand()),
        np.random.normal(),
        torch.rand(3).tolist(),
    ]
    for source in extra.values():
        if isinstance(source, torch.Generator):
            out.append(torch.rand(3, generator=source).tolist())
        elif isinstance(source, np.random.Generator):
            out.append(source.random(3).tolist())
        elif isinstance(source, np.random.RandomState):
            out.append(source.rand(3).tolist())
        else:
            out.append(source.random())  # type: ignore[attr-defined]
    return out


def test_every_stream_is_captured_and_restored_through_a_file(tmp_path) -> None:
    extra = {
        "torch_gen": torch.Generator().manual_seed(3),
        "np_gen": np.random.default_rng(5),
        "np_legacy": np.random.RandomState(6),
        "py": random.Random(7),
    }
    streams = RandomStreams(extra)
    draws(extra)  # move every stream away from its seed
    random.gauss(0, 1)  # leave a cached gaussian in Python's state
    data, size = codec.encode(streams.state_dict())
    expected = draws(extra)
    draws(extra)
    streams.load_state_dict(codec.decode(data, tmp_path / "x", raw_size=size))
    assert draws(extra) == expected


def test_only_restores_the_named_streams() -> None:
    streams = RandomStreams()
    saved = streams.state_dict()
    first = random.random()
    torch_first = torch.rand(1).item()
    streams.load_state_dict(saved, only=["python"])
    assert random.random() == first
    assert torch.rand(1).item() != torch_first


def test_one_generator_under_two_names_is_one_stream() -> None:
    generator = torch.Generator()
    assert (
        RandomStreams({"loader.generator": generator, "sampler.generator": generator}).names()[-1]
        == "loader.generator"
    )


def test_digest_tells_states_apart() -> None:
    torch.manual_seed(1)
    a = RandomStreams().state_dict()["torch"]
    torch.manual_seed(2)
    b = RandomStreams().state_dict()["torch"]
    assert tree_digest(a) != tree_digest(b)
    assert tree_digest(a) == tree_digest(dict(a))


def test_unknown_generator_types_are_refused_by_name() -> None:
    streams = RandomStreams({"weird": object()})  # type: ignore[dict-item]
    with pytest.raises(BisectReproError, match=r"generators: object"):
        streams.state_dict()


def test_a_random_state_on_another_bit_generator_than_mt19937_is_refused_with_the_fix() -> None:
    streams = RandomStreams({"legacy": np.random.RandomState(np.random.PCG64(0))})
    refused = pytest.raises(
        BisectReproError,
        match=r"drawing from PCG64, not MT19937.*numpy.random.Generator\(PCG64\(\)\)",
    )
    # the warning is numpy's own, from get_state(legacy=True)
    with refused, pytest.warns(RuntimeWarning, match="MT19937"):
        streams.state_dict()


@pytest.mark.cuda
def test_cuda_streams_are_captured_and_restored() -> None:
    torch.cuda.init()
    streams = RandomStreams()
    assert "cuda:0" in streams.names()
    saved = streams.state_dict()
    expected = torch.rand(4, device="cuda").tolist()
    streams.load_state_dict(saved)
    assert torch.rand(4, device="cuda").tolist() == expected
