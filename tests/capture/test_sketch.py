"""The linear sketch: its definition (against a plain-Python reference), linearity, keying by the
global index (shards add up), the C kernel against torch ops (alone and in the hash's pass), and
the distance it estimates."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from bisect_repro.capture import _hash_cpu, sketch
from bisect_repro.capture.activations import ActivationSketches
from bisect_repro.capture.hashing import PendingHashes, hash_tensors

_C = _hash_cpu.load()
fused_kernel = pytest.mark.skipif(
    _C is None or not _C.sketches, reason="the C kernel is not built here"
)

_MASK = (1 << 64) - 1


def _mix(z: int) -> int:
    z = (z + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _reference_sign(g: int) -> float:
    z = _mix((g >> 16) ^ sketch.SEED)
    slot = ((g & 0xFFFF) + (z & 0xFFFF)) & 0xFFFF
    table = -1.0 if _mix(slot ^ sketch.SEED ^ sketch.TABLE_KEY) >> 63 else 1.0
    return (-1.0 if z >> 63 else 1.0) * table


def _reference(values: list[float], offset: int) -> list[float]:
    """The definition, element by element, in Python floats (float64)."""
    out = [0.0] * sketch.WIDTH
    for i, value in enumerate(values):
        g = offset + i
        out[g % sketch.WIDTH] += _reference_sign(g) * value
    return out


@pytest.mark.parametrize(
    ("size", "offset"),
    [(1, 0), (127, 0), (300, 5), (1000, 128 * 7 + 3), (2049, (1 << 40) - 1000), (70_000, 65_000)],
)
def test_every_path_computes_the_definition(size: int, offset: int) -> None:
    values = torch.randn(size, generator=torch.Generator().manual_seed(size))
    expected = torch.tensor(_reference(values.double().tolist(), offset), dtype=torch.float64)
    assert torch.allclose(sketch.sketch_flat(values, offset), expected, rtol=1e-12, atol=1e-12)
    indices = torch.arange(offset, offset + size)
    assert torch.allclose(sketch.sketch_indexed(values, indices), expected, rtol=1e-12, atol=1e-12)
    if sketch._kernel() is not None:  # the C kernel, where it was built
        assert torch.allclose(
            sketch._native([(values, offset)])[0], expected, rtol=1e-12, atol=1e-12
        )


@fused_kernel
@pytest.mark.parametrize(
    ("chunk_words", "threads", "team"),
    [(7, 3, False), (1000, 2, True), (_hash_cpu.CHUNK_WORDS, 1, True)],
)
def test_the_hash_pass_sketches_as_the_definition_and_hashes_as_before(
    chunk_words: int, threads: int, team: bool
) -> None:
    g = torch.Generator().manual_seed(chunk_words)
    tensors = [torch.randn(n, generator=g) for n in (1, 127, 3000, 70_000)] + [
        torch.arange(50, dtype=torch.int32),
        torch.randn(33, 3),
    ]
    starts = [0, 5, 128 * 7 + 3, (1 << 40) - 1000, None, None]  # None: hashed, not sketched
    pointers, sizes = [t.data_ptr() for t in tensors], [t.nbytes for t in tensors]
    assert _C is not None
    lanes, rows = _C.lanes_and_sketches(
        pointers,
        sizes,
        starts,
        sketch.WIDTH,
        sketch.SEED,
        threads=threads,
        chunk_words=chunk_words,
        use_team=team,
    )
    assert (
        lanes.tolist()
        == _C.lanes_of_buffers(
            pointers, sizes, threads=threads, chunk_words=chunk_words, use_team=team
        ).tolist()
    )
    for tensor, start, row in zip(tensors, starts, rows, strict=True):
        expected = (
            torch.zeros(sketch.WIDTH, dtype=torch.float64)
            if start is None
            else sketch.sketch_flat(tensor, start)
        )
        assert torch.allclose(torch.from_numpy(row), expected, rtol=1e-12, atol=1e-12)
    small = tensors[1]  # and one against the plain-Python definition itself
    one = _C.lanes_and_sketches(
        [small.data_ptr()], [small.nbytes], [5], sketch.WIDTH, sketch.SEED, chunk_words=chunk_words
    )[1][0]
    assert np.allclose(one, _reference(small.double().tolist(), 5), rtol=1e-12, atol=1e-12)


@fused_kernel
def test_the_hash_pass_sketch_is_the_same_bits_on_any_threads() -> None:
    values = torch.randn(300_000, generator=torch.Generator().manual_seed(4)) * torch.logspace(
        -30, 30, 300_000
    )
    assert _C is not None
    rows = [
        _C.lanes_and_sketches(
            [values.data_ptr()],
            [values.nbytes],
            [3],
            sketch.WIDTH,
            sketch.SEED,
            threads=n,
            chunk_words=999,
            use_team=team,
        )[1]
        for n, team in [(1, True), (3, False), (4, True), (2, False)]
    ]
    # the pieces are added in order, whoever took them
    assert all(np.array_equal(rows[0], other) for other in rows[1:])


def test_a_snapshot_s_plain_float32_parameters_are_sketched_in_the_hash_pass() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Linear(200, 3).double())
    parameters = dict(model.named_parameters()) | {"transposed": torch.randn(30, 20).t()}
    hashed = parameters | {"buffer": torch.randn(10)}
    fused = sketch.fusable(parameters, hashed)
    # not float64, not a strided view
    assert sorted(fused) == ["0.bias", "0.weight"] and set(fused.values()) == {0}
    # not hashed as they are
    assert sketch.fusable(parameters, {n: t.detach().clone() for n, t in hashed.items()}) == {}
    pending = PendingHashes()
    pending.add(hashed, fused)
    lanes = pending.fetch_lanes()
    assert lanes.digests() == hash_tensors(hashed)  # the hashes are those of the hash alone
    if _C is not None and _C.sketches:
        assert sorted(lanes.sketches) == ["0.bias", "0.weight"]
    names, values = sketch.sketch_tensors(parameters, lanes.sketches)
    assert names == ["0.weight", "0.bias", "1.weight", "1.bias", "transposed"]
    for name, row in zip(names, values, strict=True):
        assert torch.allclose(
            row, sketch.sketch_flat(parameters[name].detach().contiguous()), rtol=1e-12, atol=1e-10
        ), name
    # a sketch given is used as it is
    _, given = sketch.sketch_tensors(parameters, {"0.bias": np.full(sketch.WIDTH, 7.0)})
    assert torch.equal(given[1], torch.full((sketch.WIDTH,), 7.0, dtype=torch.float64))


def test_private_copies_on_the_cpu_are_sketched_when_fetched_and_a_device_s_at_transfer() -> None:
    copies = {"a": torch.randn(5000), "b": torch.randn(70, dtype=torch.float64)}
    pending = sketch.queue_sketches(copies, private=True)
    expected = torch.stack([sketch.sketch_flat(copies["a"]), sketch.sketch_flat(copies["b"])])
    # the C kernel's row waits for fetch (on the recorder's writer thread)
    if sketch._kernel() is not None:
        assert not pending.host[0].any() and len(pending.later) == 1
    pending.transfer()  # the torch-op row (float64: not the kernel's) is there after the transfer
    assert torch.allclose(pending.host[1], expected[1], rtol=1e-12, atol=1e-12)
    assert torch.allclose(pending.fetch(), expected, rtol=1e-12, atol=1e-12) and not pending.later


def test_signs_are_balanced_and_uncorrelated_between_buckets() -> None:
    signs = sketch.signs(torch.arange(1 << 18))
    assert abs(float(signs.mean())) < 0.01
    assert set(signs.unique().tolist()) == {-1.0, 1.0}
    # a constant difference spreads over the buckets as independent sums, not one value repeated
    buckets = sketch.sketch_flat(torch.ones(1 << 18))
    assert float(buckets.std()) > 0.5 * float(buckets.abs().mean())


def test_linear() -> None:
    g = torch.Generator().manual_seed(1)
    x, y = (
        torch.randn(5000, generator=g, dtype=torch.float64),
        torch.randn(5000, generator=g, dtype=torch.float64),
    )
    assert torch.allclose(
        sketch.sketch_flat(x) + 3 * sketch.sketch_flat(y),
        sketch.sketch_flat(x + 3 * y),
        rtol=1e-12,
        atol=1e-10,
    )


def test_shards_add_up_to_the_whole_by_their_global_indices() -> None:
    whole = torch.randn(96, 70, generator=torch.Generator().manual_seed(2))
    expected = sketch.sketch_tensors({"w": whole})[1][0]
    # Shard(0): contiguous ranges
    rows = sketch.sketch_flat(whole[:40], 0) + sketch.sketch_flat(whole[40:], 40 * 70)
    assert torch.allclose(rows, expected, rtol=1e-12, atol=1e-10)
    # Shard(1): a block of columns
    index = sketch._global_indices([96, 70], [96, 30], [0, 40], torch.device("cpu"))
    assert torch.equal(index, torch.arange(96 * 70).reshape(96, 70)[:, 40:])
    left = sketch._global_indices([96, 70], [96, 40], [0, 0], torch.device("cpu"))
    columns = sketch.sketch_indexed(whole[:, :40], left) + sketch.sketch_indexed(
        whole[:, 40:], index
    )
    assert torch.allclose(columns, expected, rtol=1e-12, atol=1e-10)
    # keyed by position: the same values at other global indices sketch differently
    assert not torch.allclose(
        sketch.sketch_flat(whole[40:], 0), sketch.sketch_flat(whole[40:], 40 * 70)
    )


def test_tensors_of_every_kind_by_name() -> None:
    tensors = {
        "f32": torch.randn(1000),
        "f64": torch.randn(10, 10, dtype=torch.float64),
        "bf16": torch.randn(300).to(torch.bfloat16),
        "strided": torch.randn(30, 20).t(),
        "ints": torch.arange(10),
    }
    names, values = sketch.sketch_tensors(tensors)
    assert (
        names == ["f32", "f64", "bf16", "strided"]
        and values.shape == (4, sketch.WIDTH)
        and values.dtype == torch.float64
    )
    for name, row in zip(names, values, strict=True):
        assert torch.allclose(row, sketch.sketch_flat(tensors[name]), rtol=1e-12, atol=1e-10)


@pytest.mark.parametrize("seed", range(12))
def test_the_distance_estimate_is_within_its_error_of_the_exact_one(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(40_000, generator=g)
    b = a + torch.randn(40_000, generator=g) * 10.0 ** -(seed % 6 + 1) * torch.rand(
        40_000, generator=g
    )
    estimate = float((sketch.sketch_flat(a) - sketch.sketch_flat(b)).norm())
    exact = float((a.double() - b.double()).norm())
    assert abs(estimate / exact - 1) <= sketch.relative_error_bound()
    assert sketch.relative_error_bound() < 0.5  # an estimate worth having on a log scale


def test_rounding_level_differences_are_seen_in_float64() -> None:
    a = torch.randn(100_000, generator=torch.Generator().manual_seed(3))
    b = torch.nextafter(a, torch.full_like(a, math.inf))  # every element one ulp up
    estimate = float(
        (sketch.sketch_tensors({"a": a})[1] - sketch.sketch_tensors({"a": b})[1]).norm()
    )
    exact = float((a.double() - b.double()).norm())
    assert exact > 0 and abs(estimate / exact - 1) <= sketch.relative_error_bound()


def _hooked(model: torch.nn.Module) -> list[str]:
    """The modules of ``model`` an activation hook in place samples, in order. The hook is torch's
    global one: nothing is ever put on the model's own modules."""
    assert all(not module._forward_hooks for module in model.modules())
    hooks = [
        hook.__self__
        for hook in torch.nn.modules.module._global_forward_hooks.values()
        if isinstance(getattr(hook, "__self__", None), ActivationSketches)
    ]
    names = {name for sampler in hooks for name in sampler._names.values()}
    return [name for name, _ in model.named_modules() if name in names]


def test_activation_sketches_follow_the_modules_in_the_order_they_ran() -> None:
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.ReLU(inplace=True), torch.nn.Linear(8, 2)
    )
    x = torch.randn(3, 4)
    hooks = ActivationSketches(model)
    model(x)
    # not started: nothing taken, no hook in place
    assert hooks.take() is None and _hooked(model) == []
    hooks.start()
    assert _hooked(model) == ["0", "1", "2"]  # the leaves only
    model(x)
    model(x)  # a second call is not taken
    found = hooks.take()
    assert found is not None and _hooked(model) == []  # taking removed the hooks
    names, values = found.names, found.fetch()
    assert names == ["0", "1", "2"] and values.shape == (3, sketch.WIDTH)
    hidden = model[0](x)
    # taken before ReLU changed it in place
    assert torch.allclose(values[0], sketch.sketch_flat(hidden.detach()))
    model(x)
    assert hooks.take() is None  # between two starts nothing is taken
    hooks.start()
    hooks.remove()
    model(x)
    # removed mid-step: gone, with what they took
    assert hooks.take() is None and _hooked(model) == []
    hooks.start()
    model(x)
    kept = hooks.take(keep=True)  # the next step starts at a snapshot too: the hooks stay
    assert kept is not None and kept.names == ["0", "1", "2"] and _hooked(model) == ["0", "1", "2"]
    model(x[:1])  # between the two (an evaluation pass): taken, then forgotten at the start
    hooks.start()
    assert len(torch.nn.modules.module._global_forward_hooks) == 1  # not put on twice
    model(x)
    again = hooks.take()
    assert again is not None and torch.equal(again.fetch(), kept.fetch()) and _hooked(model) == []


def test_a_model_compiled_whole_is_compiled_once_without_the_hooks_and_once_with_them() -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    compiled = torch.compile(model, backend="eager")
    hooks = ActivationSketches(model)
    x = torch.randn(3, 4)
    expected = model(x)
    graphs = []
    # as the recorder does: the hooks on at the step that starts at a snapshot (step 0 first), off
    # after
    for _ in range(3):
        hooks.start()
        assert torch.equal(compiled(x), expected)
        assert hooks.take() is None  # inside the compiled graph the hooks do nothing
        assert torch.equal(compiled(x), expected)
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    # traced with the hooks, its guards check them: one graph with, one without, each reused
    assert graphs == [2, 2, 2]
    torch._dynamo.reset()


def test_a_compiled_block_keeps_its_one_graph_and_the_modules_around_it_are_taken() -> None:
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    block = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.compile(block, backend="eager"), torch.nn.Linear(8, 2)
    )
    hooks = ActivationSketches(model)
    x = torch.randn(3, 4)
    for _ in range(3):
        model(x)
        hooks.start()
        assert "1._orig_mod.0" not in _hooked(model)
        model(x)
        found = hooks.take()
        assert found is not None and found.names == ["0", "2"]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    torch._dynamo.reset()
