"""The replay protocol's messages survive the channel's JSON, and a reply read back is typed."""

from __future__ import annotations

import json

import pytest
import torch

from bisect_repro.capture.compiled import CompileCall
from bisect_repro.capture.trace import OpRecord, TraceEntry
from bisect_repro.serve.protocol import (
    CompileCalls,
    Description,
    Exited,
    Fetched,
    Hello,
    HiddenStream,
    ItemsChange,
    Restored,
    Rewound,
    SkipResult,
    StateHashes,
    StepRecord,
    StepResult,
    StepStart,
)
from bisect_repro.serve.replies import REPLIES, Refused, decode_reply
from bisect_repro.serve.requests import (
    REQUESTS,
    Compiled,
    Data,
    Describe,
    Exit,
    Fetch,
    Hashes,
    Items,
    Request,
    Restore,
    Rewind,
    Run,
    Skip,
    Streams,
    UnknownRequest,
    decode,
    encode,
)


def through_json(message: dict) -> dict:
    return json.loads(json.dumps(message))


def test_requests_round_trip_and_take_their_defaults() -> None:
    run = Run(
        step=3,
        trace="full",
        keep=(1, 4),
        ops="backward",
        environment={"torch.get_num_threads": 1},
        fixed_entropy=7,
        commit=True,
    )
    message, tree = encode(run)
    assert message["op"] == "run" and tree is None and decode(through_json(message)) == run
    assert Run.from_json({"step": 2}) == Run(step=2)  # light trace, nothing kept, nothing fixed
    assert Skip.from_json({"until": 9, "hashes_at": [5, 10]}) == Skip(until=9, hashes_at=(5, 10))
    assert Fetch.from_json({}) == Fetch() and Fetch.from_json({"keep": [2]}).keep == (2,)
    assert Restore.from_json({"run": "/r", "step": 4}) == Restore(
        run="/r", step=4, environment={}, rebuilt=False
    )


EVERY: list[Request] = [
    Restore(
        run="/r",
        step=4,
        environment={"torch.use_deterministic_algorithms": True},
        rebuilt=True,
        kept_from=5,
        seeded=("numpy", "python"),
    ),
    Skip(until=9, hashes_at=(5, 8)),
    Fetch(keep=(1, 2)),
    Run(step=3, trace="full", keep=(0,), streams={"torch": torch.arange(4)}, kept_entropy=True),
    Rewind(step=3),
    Streams(step=3),
    Data(step=3, pre_streams={"torch": torch.arange(2)}),
    Items(step=3, stream="loader.dataset.rng"),
    Hashes(),
    Describe(),
    Compiled(),
    Exit(),
]


@pytest.mark.parametrize("request_", EVERY, ids=lambda r: r.op)
def test_every_request_is_encoded_and_decoded_by_its_op(request_: Request) -> None:
    """One encoder and one decoder: the JSON carries ``op`` and the fields, the state tree the
    stream states."""
    message, tree = encode(request_)
    decoded = decode(through_json(message), tree)
    assert type(decoded) is type(request_) and message["op"] == request_.op
    assert {k: v for k, v in vars(decoded).items() if k not in request_.TREE} == {
        k: v for k, v in vars(request_).items() if k not in request_.TREE
    }
    for name in request_.TREE:
        sent, received = getattr(request_, name), getattr(decoded, name)
        assert (sent is None and received is None) or torch.equal(sent["torch"], received["torch"])
        assert name not in message


def test_every_op_has_one_request_and_an_unknown_one_is_refused() -> None:
    assert sorted(REQUESTS) == sorted(r.op for r in EVERY)
    with pytest.raises(UnknownRequest, match="unknown request 'ping'"):
        decode({"op": "ping"})


def test_replies_round_trip() -> None:
    fetched = Fetched(step=2, indices=[3, 1], order="o", batch="b", base_seed=11)
    assert (
        Fetched.from_json(through_json(fetched.to_json())) == fetched
        and fetched.digest("order") == "o"
    )
    skipped = SkipResult(
        step=6,
        records=[StepRecord(step=5, order=None, batch="b5", loss=0.5)],
        hashes={6: {"w": "h"}},
    )
    assert SkipResult.from_json(through_json(skipped.to_json())) == skipped
    described = Description(
        init={"w": "h"},
        streams={"torch": "t"},
        hidden={"loader.dataset.rng": HiddenStream(kind="numpy.random.Generator", digest="r")},
        environment={"torch.get_num_threads": 2},
        threads_set=[2],
        loader={"kind": "DataLoader"},
        convolutions=True,
        build_seeding=[],
    )
    assert Description.from_json(through_json(described.to_json())) == described
    start = StepStart(streams={"torch": {"kind": "torch"}}, pre_streams={}, data=None)
    assert StepStart.from_tree(start.to_tree()) == start
    call = CompileCall(
        target="Net",
        backend="inductor",
        settings="mode=default",
        replayable=False,
        why_not="a function",
    )
    for reply in (
        Restored(step=4),
        StateHashes(hashes={"w": "h"}),
        ItemsChange(changes=None),
        ItemsChange(changes=True),
        CompileCalls(calls=[call]),
    ):
        assert type(reply).from_json(through_json(reply.to_json())) == reply


ANSWERED = {
    "restore": (Restored(step=4).to_json(), None),
    "skip": (
        SkipResult(step=6, records=[StepRecord(step=5, order="o", batch="b", loss=None)]).to_json(),
        None,
    ),
    "fetch": (Fetched(step=2, indices=[3]).to_json(), None),
    "run": StepResult(step=3, outcome="o", kept={0: torch.ones(2)}).to_reply(),
    "rewind": ({"step": 3, "consumes": True}, None),
    "streams": (
        {"step": 3},
        StepStart(
            streams={"torch": {"s": 1}}, pre_streams={"torch": {"s": 0}}, data=None
        ).to_tree(),
    ),
    "data": (Fetched(step=3, batch="b").to_json(), None),
    "items": (ItemsChange(changes=False).to_json(), None),
    "hashes": (StateHashes(hashes={"w": "h"}).to_json(), None),
    "describe": (
        Description(
            init={},
            streams={},
            hidden={},
            environment={},
            threads_set=[],
            loader={},
            convolutions=False,
            build_seeding=[],
        ).to_json(),
        None,
    ),
    "compiled": (CompileCalls(calls=[]).to_json(), None),
    "exit": ({"ok": True}, None),
}
"""What a replaying process answers to each request, as it sends it."""


@pytest.mark.parametrize("request_", EVERY, ids=lambda r: r.op)
def test_every_reply_is_decoded_into_the_class_its_request_names(request_: Request) -> None:
    message, tree = ANSWERED[request_.op]
    reply = decode_reply(request_, through_json(message), tree)
    assert type(reply) is REPLIES[request_.op]
    if isinstance(reply, StepResult):
        assert reply.outcome == "o" and torch.equal(reply.kept[0], torch.ones(2))
    elif isinstance(reply, StepStart):
        assert reply.streams == {"torch": {"s": 1}} and reply.pre_streams == {"torch": {"s": 0}}
    elif isinstance(reply, Rewound | Exited):
        assert reply in (Rewound(step=3, consumes=True), Exited(ok=True))
    else:
        assert reply.to_json() == message


def test_the_reply_table_names_each_request_class_once_and_an_error_is_refused() -> None:
    assert set(REPLIES) == set(REQUESTS)
    assert (
        REPLIES["run"] is StepResult
        and REPLIES["streams"] is StepStart
        and REPLIES["data"] is Fetched
    )
    with pytest.raises(Refused, match="step 9 cannot be rewound here"):
        decode_reply(Rewind(step=9), {"error": "step 9 cannot be rewound here"})


def test_a_step_result_crosses_as_json_and_a_tree_of_its_kept_tensors() -> None:
    kept = torch.arange(4.0)
    result = StepResult(
        step=3,
        entries=[
            TraceEntry("forward", "0", "0.output", "d1"),
            TraceEntry("optimizer", "0", "0.weight", "d2"),
        ],
        kept={1: kept},
        ops=[OpRecord("aten.mm.default", "0", ("a", "b"), ("c",), "[]", "forward")],
        alerts=[{"op": "aten.put_.default", "layer": "1", "phase": "forward", "message": "m"}],
        loss=0.25,
        outcome="o",
        streams_after={"torch": "t"},
        seeding=[
            {"stream": "torch", "call": "torch.seed()", "entropy": True, "where": "train.py:9"}
        ],
        batch="b",
    )
    reply, tree = result.to_reply()
    back = StepResult.from_reply(through_json(reply), tree)
    assert (
        back.entries == result.entries
        and back.ops == result.ops
        and torch.equal(back.kept[1], kept)
    )
    assert (back.loss, back.outcome, back.streams_after, back.seeding, back.alerts, back.batch) == (
        0.25,
        "o",
        {"torch": "t"},
        result.seeding,
        result.alerts,
        "b",
    )
    untraced = StepResult.from_reply(through_json(StepResult(step=1).to_reply()[0]), None)
    assert untraced.entries == [] and untraced.ops is None and untraced.kept == {}


def test_a_hello_keeps_what_the_ranked_replica_checks_and_trusts_only_an_int_pid() -> None:
    assert Hello.from_json({"pid": 12, "rank": 1, "world_size": 2, "reruns": False}) == Hello(
        pid=12, rank=1, world_size=2, reruns=False
    )
    odd = Hello.from_json({"pid": "1; rm -rf", "rank": "0"})
    # kept as sent: the ranked replica refuses a rank that is not an int
    assert odd.pid == 0 and odd.rank == "0"
