"""``data_order``: the batches held different samples (the loader's sample indices differ).

The records name it from the step logs: the first step whose sample indices differ, at or before
the divergence. Where a stream the loader draws from was reseeded from entropy since the step
before it ended (an epoch's shuffle drawn after a ``torch.seed()`` in the evaluation), that order
is the reseed's (``rng_state``, in the data of that step, "between steps N-1 and N"). Never named
where no indices were recorded: the order is not known to differ.
"""

from __future__ import annotations

from ....capture.rng import loader_draws_from
from ....capture.seeding import SeedingCall
from ...advice import data_fix
from ..records import Records
from ..signals import Signals, at_or_before
from ..verdict import Verdict
from .cause import Cause
from .entry import CauseEntry, Finding, Particulars, RecordsSignal, Window, calls_described

__all__ = ["ENTRY"]


def _order(records: Records, w: Window) -> Finding | None:
    step = records.logs.get("order")
    if step is None or step > w.end:
        return None
    drawn = [
        (s, c)
        for s, c in records.reseeds(max(step - 1, 0), step)
        if s == step and loader_draws_from(str(c.get("stream", "")))
    ]
    if drawn:  # the step's shuffle drew from a stream reseeded since the last step ended
        streams = sorted({str(c["stream"]) for _, c in drawn})
        what = (
            f"{', '.join(streams)} was reseeded from entropy between steps {step - 1} and {step} "
            f"({calls_described(drawn)}), "
            f"and the data of step {step} was drawn from it: the batches hold different samples"
        )
        return Finding(
            cause=Cause.RNG_STATE,
            what=what,
            step=step,
            phase="data",
            tensor="batch.indices",
            rng=streams,
            reseeded=[SeedingCall.from_json(c) for _, c in drawn],
        )
    return Finding(
        cause=Cause.DATA_ORDER,
        what="the batches hold different samples",
        step=step,
        phase="data",
        tensor="batch.indices",
        rng=[s for s in w.changed if loader_draws_from(s)],
    )


def _holds(s: Signals, v: Verdict) -> bool:
    return at_or_before(s.order, v)


def _explain(p: Particulars) -> str:
    fetched = f"; with run A's {p.data_by} run B fetches run A's batch" if p.data_by else ""
    return f"the runs fed different samples: {p.where}{fetched}"


ENTRY = CauseEntry(
    cause=Cause.DATA_ORDER,
    title="the data order",
    meaning="the batches held different samples",
    requires="the sample order (the loader's indices) differs at or before the step",
    holds=_holds,
    proof="run B's batch fetched again under run A's loader and streams, then in a fresh process",
    unproven="inferred from the step logs: the batches hold different samples",
    remedy="`DataLoader(..., generator=torch.Generator().manual_seed(seed))`; the same batch "
    "size, sampler and `set_epoch`",
    fix=lambda p: data_fix(p.loader, order=True, resumed=p.resumed),
    explain=_explain,
    signals=(
        RecordsSignal(
            name="order",
            rank=10,
            when="the sample order differs (a loader stream reseeded just before: rng_state, in "
            "the data)",
            find=_order,
        ),
    ),
)
