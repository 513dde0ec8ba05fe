"""Non-tensor state compared snapshot by snapshot, and the config key that set it."""

from __future__ import annotations

from bisect_repro.diagnose.compare.settings import settings_difference


def test_the_first_snapshot_whose_settings_differ_is_found_with_the_config_key_that_set_it() -> (
    None
):
    same = {"optimizer.group0.lr": 0.1, "scheduler.milestones": {"40": 1}}
    snapshots = [
        (0, same, dict(same)),
        (
            5,
            {**same, "optimizer.group0.lr": 0.1},
            {"optimizer.group0.lr": 0.01, "scheduler.milestones": {"30": 1}},
        ),
        (10, {**same, "optimizer.group0.lr": 0.5}, {**same, "optimizer.group0.lr": 0.7}),
    ]
    found = settings_difference(
        snapshots, {"milestone": [None, 30], "seed": [1, 2], "lr": [0.3, 0.4]}
    )
    assert found is not None and found.step == 5
    assert found.differing == {
        "optimizer.group0.lr": [0.1, 0.01],
        "scheduler.milestones": [{"40": 1}, {"30": 1}],
    }
    # 30 is run B's milestone; seed and lr are not what differs
    assert found.config_keys == ["milestone"]
    assert (
        "scheduler.milestones" in found.describe()
        and "set by the config key milestone" in found.describe()
    )


def test_runs_without_settings_or_with_equal_ones_have_no_difference() -> None:
    assert (
        settings_difference(
            [(0, None, None), (5, {"a": 1}, "damaged"), (10, {"a": 1}, {"a": 1, "b": 2})], {}
        )
        is None
    )


def test_a_huge_setting_from_a_hostile_run_is_shown_cut_short() -> None:
    found = settings_difference([(0, {"k" * 500: "x" * 10**6}, {"k" * 500: "y"})], {})
    assert found is not None and len(found.describe()) < 400
