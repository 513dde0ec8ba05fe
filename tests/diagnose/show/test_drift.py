"""Replica drift read from the records: which tensors are compared, between which ranks, and who
parted."""

from __future__ import annotations

from bisect_repro.diagnose.show.drift import rank_drift
from bisect_repro.store.run import Run
from tests.fakes import fake_ranks


def by_rank(*ranks: dict[int, dict[str, str]]) -> dict[int, dict[int, dict[str, str]]]:
    return dict(enumerate(ranks))


def test_ddp_replicas_part_where_one_rank_differs_from_the_others(tmp_path) -> None:
    same = {"w": "1", "optimizer.w.exp_avg": "2", "bn.running_mean": "m", "state.counter": "c"}
    moved = {**same, "w": "9"}
    hashes = by_rank(
        {0: same, 2: same, 4: same},
        {0: same, 2: same, 4: moved},
        {0: same, 2: {**same, "bn.running_mean": "own", "state.counter": "own"}, 4: same},
    )
    drift = rank_drift(Run.open(fake_ranks(tmp_path / "r", hashes, rank_local=["bn.running_mean"])))
    assert (drift.step, drift.last_equal, drift.snapshots, drift.ranks) == (4, 2, [0, 2, 4], [1])
    assert [(t.tensor, t.ranks, t.group) for t in drift.tensors] == [("w", [1], [0, 1, 2])]
    # w and its Adam state; not the rank-local buffer, not the trainee's own state
    assert drift.compared == 2
    assert drift.to_json()["tensors"] == [{"tensor": "w", "ranks": [1], "group": [0, 1, 2]}]


def test_two_replicas_that_part_name_the_one_that_is_not_rank_0(tmp_path) -> None:
    hashes = by_rank({0: {"w": "a"}, 2: {"w": "b"}}, {0: {"w": "a"}, 2: {"w": "c"}})
    drift = rank_drift(Run.open(fake_ranks(tmp_path / "r", hashes)))
    assert drift.step == 2 and drift.ranks == [1]


def test_each_rank_is_compared_within_its_own_data_parallel_group(tmp_path) -> None:
    groups = {
        0: {"replica_group": [0, 1]},
        1: {"replica_group": [0, 1]},
        2: {"replica_group": [2, 3]},
        3: {"replica_group": [2, 3]},
    }
    hashes = by_rank({0: {"w": "a"}}, {0: {"w": "a"}}, {0: {"w": "b"}}, {0: {"w": "b"}})
    assert rank_drift(Run.open(fake_ranks(tmp_path / "r", hashes, rank_extra=groups))).step is None
    hashes[3] = {0: {"w": "c"}}
    drift = rank_drift(Run.open(fake_ranks(tmp_path / "s", hashes, rank_extra=groups)))
    assert drift.step == 0 and drift.tensors[0].group == [2, 3] and drift.ranks == [3]


def test_sharded_tensors_are_compared_only_along_the_dimensions_they_are_replicated_on(
    tmp_path,
) -> None:
    # HSDP on a 2x2 mesh: dimension 0 replicates, dimension 1 shards. Ranks 0 and 2 hold one shard,
    # 1 and 3 the other.
    placed = {
        "dtensors": {
            "w": {"placements": ["R", "S(0)"], "mesh": "0"},
            "v": {"placements": ["S(0)", "S(0)"], "mesh": "0"},
        },
        "meshes": {
            "0": {
                "device_type": "cpu",
                "shape": [2, 2],
                "dim_names": None,
                "ranks": [[0, 1], [2, 3]],
            }
        },
    }
    hashes = by_rank(*({0: {"w": f"shard{r % 2}", "v": f"own{r}", "step": "1"}} for r in range(4)))
    run = Run.open(
        fake_ranks(
            tmp_path / "r", hashes, layout="fsdp", replicated="dtensor", snapshot_extra=placed
        )
    )
    drift = rank_drift(run)
    # w (in pairs) and step (over the world); v is sharded everywhere
    assert drift.step is None and drift.compared == 2
    hashes[2] = {0: {"w": "moved", "v": "own2", "step": "1"}}
    drift = rank_drift(
        Run.open(
            fake_ranks(
                tmp_path / "s", hashes, layout="fsdp", replicated="dtensor", snapshot_extra=placed
            )
        )
    )
    assert [(t.tensor, t.ranks, t.group) for t in drift.tensors] == [("w", [2], [0, 2])]


def test_nothing_is_compared_without_replicas(tmp_path) -> None:
    hashes = by_rank({0: {"w": "a"}}, {0: {"w": "b"}})
    drift = rank_drift(
        Run.open(fake_ranks(tmp_path / "r", hashes, layout="single", replicated="none"))
    )
    assert drift.step is None and drift.snapshots == [] and drift.replicated == "none"
