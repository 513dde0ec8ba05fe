"""``data_content``: the same samples gave different tensors (augmentation, an edited data file).

The records name it from the step logs: the first step whose batch differs while its sample order
is equal. A batch that differs where no sample indices were recorded places the divergence in the
data of that step, but names no cause of its own (order and content are not told apart): the next
signal's cause is named there. A replay also shows it where one run draws another batch from one
restored state (the data is drawn from a generator that no restored stream decides).
"""

from __future__ import annotations

from ...advice import data_fix, stream_fix
from ..records import Records
from ..signals import Signals, at_or_before, shown_by
from ..verdict import Outcome, Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window

__all__ = ["ENTRY"]


def _batch(records: Records, w: Window) -> Finding | None:
    step = records.logs.get("batch")
    if step is None or step > w.end or records.unordered_batch(w.end) is not None:
        return None
    return Finding(
        cause=Cause.DATA_CONTENT,
        what="the same samples give different batch contents (the sample order is equal)",
        step=step,
        phase="data",
        tensor="batch",
    )


def _holds(s: Signals, v: Verdict) -> bool:
    # one state, another batch: content, whatever the order
    redrawn = shown_by(v, ("self_rerun",), Outcome.DIFFERS, one_run=True)
    equal_order = s.order_recorded and (
        s.order is None or (s.batch is not None and s.order > s.batch)
    )
    return at_or_before(s.batch, v) and (equal_order or redrawn)


def _fix(p: Particulars) -> str:
    advice = data_fix(p.loader, order=False, resumed=p.resumed)
    return f"{stream_fix(p.streams, reseeds=p.reseeds)}; {advice}" if p.streams else advice


def _explain(p: Particulars) -> str:
    fetched = f"; with run A's {p.data_by} run B fetches run A's batch" if p.data_by else ""
    return f"the same samples gave different batch contents: {p.where}{fetched}"


ENTRY = CauseEntry(
    cause=Cause.DATA_CONTENT,
    title="the data content",
    meaning="the same samples (the sample order equal) gave different tensors (augmentation, an "
    "edited data file)",
    requires="the batch differs at or before the step while its sample order is equal (or one run "
    "draws another batch from one state)",
    holds=_holds,
    proof="run B's batch fetched again under run A's streams, or the same step drawing another "
    "batch from one state",
    unproven="inferred from the step logs: the same samples give different tensors",
    remedy="`worker_init_fn` seeding NumPy and `random` from `torch.initial_seed()`, a seeded "
    "loader generator, the same `num_workers`",
    fix=_fix,
    explain=_explain,
    signals=(
        RecordsSignal(
            name="batch",
            rank=20,
            when="the batch differs with its order equal (no indices recorded: the data of that "
            "step, the cause below)",
            find=_batch,
        ),
    ),
)
