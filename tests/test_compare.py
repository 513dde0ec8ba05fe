from __future__ import annotations

import math

import pytest
import torch

from bisect_repro.compare import compare, difference_stats
from bisect_repro.errors import RunFormatError
from bisect_repro.store import RunWriter


def test_ulp_distance_counts_representable_floats_between() -> None:
    a = torch.tensor([1.0, -2.0, 0.0, 5.0])
    b = a.clone()
    b[0] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    b[1] = torch.nextafter(torch.nextafter(torch.tensor(-2.0), torch.tensor(0.0)), torch.tensor(0.0))
    b[2] = -0.0  # equal to +0.0
    stats = difference_stats(a, b)
    assert stats["max_ulp"] == 2 and stats["fraction_differing"] == 0.5
    assert math.isclose(stats["max_abs_diff"], 2 * 2**-23, rel_tol=1e-6)


def test_ulp_across_zero_and_for_half_precision() -> None:
    tiny = torch.tensor([1e-45])  # the smallest float32 subnormal, one step from zero
    assert difference_stats(tiny, -tiny)["max_ulp"] == 2
    half = torch.tensor([1.0], dtype=torch.bfloat16)
    assert difference_stats(half, torch.nextafter(half, half * 2))["max_ulp"] == 1


def test_nans_in_the_same_place_are_equal_and_integers_have_no_ulp() -> None:
    nan = torch.tensor([float("nan"), 1.0])
    assert difference_stats(nan, nan.clone())["fraction_differing"] == 0.0
    stats = difference_stats(torch.tensor([1, 2]), torch.tensor([1, 5]))
    assert stats["max_abs_diff"] == 3 and stats["fraction_differing"] == 0.5


def fake_run(path, hashes_by_step, losses, format_version=1):
    writer = RunWriter(
        path, {"target": None, "config": {}, "model": {"parameters": {"w": [[2], "float32"]}, "buffers": {}}, "environment": {}}
    )
    if format_version != 1:
        import json

        meta = json.loads((path / "run.json").read_text())
        meta["format"] = format_version
        (path / "run.json").write_text(json.dumps(meta))
    for step, loss in enumerate(losses):
        writer.append_steps([{"step": step, "loss": loss, "order": "o", "batch": "b"}])
    for step, digest in hashes_by_step.items():
        writer.commit("snapshot", step, {"step": step, "hashes": {"w": digest}, "streams": {}, "data": {}})
    writer.finish(max(hashes_by_step))
    return path


def test_records_only_comparison_bounds_the_divergence(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x", 5: "y", 10: "z"}, [1.0] * 10)
    b = fake_run(tmp_path / "b", {0: "x", 5: "y", 10: "Z"}, [1.0] * 7 + [2.0] * 3)
    result = compare(a, b, replay=False)
    assert result["snapshots"] == {"last_equal": 5, "first_divergent": 10}
    assert result["first_log_difference"]["loss"] == 7
    assert result["verdict"]["step"] == 7 and result["verdict"]["cause"] == "unknown"
    assert compare(a, a, replay=False)["identical"]


def test_runs_of_different_formats_are_refused(tmp_path) -> None:
    a = fake_run(tmp_path / "a", {0: "x"}, [1.0])
    b = fake_run(tmp_path / "b", {0: "x"}, [1.0], format_version=0)
    with pytest.raises(RunFormatError):
        compare(a, b, replay=False)
