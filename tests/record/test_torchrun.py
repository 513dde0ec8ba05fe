"""The launcher's side of ``record --nproc-per-node``: which rank's error it prints, and its
progress."""

from __future__ import annotations

from bisect_repro.record.torchrun import _Committed, _first_error


def test_the_rank_that_failed_on_its_own_is_named_before_those_it_stopped(tmp_path) -> None:
    (tmp_path / "rank0.peer").write_text(
        "rank 0: runs/a: another rank could not start recording; its error says why\n"
    )
    (tmp_path / "rank1.error").write_text(
        "rank 1: runs/a/rank1: cannot create the rank's folder: No space left on device\n"
    )
    assert (
        _first_error(tmp_path)
        == "rank 1: runs/a/rank1: cannot create the rank's folder: No space left on device"
    )
    (tmp_path / "rank1.error").unlink()
    assert _first_error(tmp_path).startswith("rank 0: runs/a: another rank")  # type: ignore[union-attr]
    assert _first_error(tmp_path / "none") is None


def test_progress_counts_rank_0s_step_lines_as_they_are_appended(tmp_path) -> None:
    committed = _Committed(tmp_path)
    assert committed.count() == 0  # no folder yet
    (tmp_path / "rank0").mkdir()
    log = tmp_path / "rank0" / "steps.jsonl"
    log.write_text('{"step": 0}\n{"step": 1}\n{"step"')
    assert committed.count() == 2
    with open(log, "a") as handle:
        handle.write(': 2}\n{"step": 3}\n')
    assert committed.count() == 4
    log.write_text('{"step": 0}\n')  # rewritten shorter by a resume
    assert committed.count() == 1
