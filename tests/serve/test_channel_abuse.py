"""The control channel under abuse by another process of the same user: malformed hellos, frames
that declare huge lengths, and clients that connect and dawdle are closed without crashing,
blocking or bloating the listener, and the genuine replica connecting afterwards is served."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bisect_repro.serve import channel as channel_module
from bisect_repro.serve.channel import (
    HELLO_HEADER_CAP,
    PENDING_CAP,
    Channel,
    ChannelClosed,
    Listener,
)

FRAME = struct.Struct("!II")


def gives_up_after(seconds: float) -> Callable[[], None]:
    """A ``wait`` for accept that gives up after ``seconds`` (a hung accept fails the test, not the
    suite)."""
    end = time.monotonic() + seconds

    def wait() -> None:
        if time.monotonic() > end:
            raise ChannelClosed("test: accept gave up waiting")

    return wait


@pytest.fixture
def listener() -> Iterator[Listener]:
    opened = Listener()
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def pool() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(2) as executor:
        yield executor


def accepting(pool: ThreadPoolExecutor, listener: Listener, seconds: float = 10) -> Future:
    return pool.submit(listener.accept, gives_up_after(seconds))


def intruder(listener: Listener) -> socket.socket:
    # a backlog that stays full (a listener that stopped accepting) fails, not hangs
    end = time.monotonic() + 5
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(listener.address)
        except BlockingIOError:
            sock.close()
            if time.monotonic() > end:
                raise
            time.sleep(0.01)
            continue
        sock.setblocking(True)
        return sock


def frame(header: bytes, payload_size: int = 0, header_size: int | None = None) -> bytes:
    return FRAME.pack(len(header) if header_size is None else header_size, payload_size) + header


def genuine(listener: Listener, future: Future, pid: int = 7) -> Channel:
    """The real replica connects after the intruder; accept must hand it over (the future's timeout
    bounds how long: no tighter bound on time, which a loaded machine would break)."""
    replica = Channel.connect(listener.address, listener.token, {"pid": pid})
    channel, hello = future.result(timeout=15)
    assert hello["pid"] == pid and hello["op"] == "hello"
    channel.send({"op": "ping"})
    assert replica.receive()[0] == {"op": "ping"}  # the channel handed over is the replica's
    replica.close()
    channel.close()
    return channel


def assert_closed(sock: socket.socket, within: float = 3) -> None:
    """The listener closed this connection: it reads end-of-file (or a reset), not silence."""
    sock.settimeout(within)
    try:
        while sock.recv(1 << 16):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        pytest.fail("the listener kept the connection open")
    finally:
        sock.close()


@pytest.mark.parametrize(
    "header",
    [
        b"[1, 2, 3]",
        b'"hello"',
        b"42",
        b"null",
        b"not json at all",
        b"\xff\xfe\x00",
        b"[" * 4000,
        b'{"op": "hello"}',
        b'{"op": "hello", "token": 12345}',
        b'{"op": "hello", "token": ["x"]}',
        b'{"op": "bye", "token": "x"}',
        b'{"op": "hello", "token": "\\u00e9\\ud800"}',
        b'{"op": "hello", "token": "wrong"}',
    ],
)
def test_a_malformed_or_wrong_hello_is_closed_and_the_replica_still_served(
    listener, pool, header
) -> None:
    future = accepting(pool, listener)
    bad = intruder(listener)
    bad.sendall(frame(header))
    assert_closed(bad)
    assert not future.done()  # no crash: accept goes on
    genuine(listener, future)


@pytest.mark.parametrize(
    ("declared", "payload_size"),
    [(HELLO_HEADER_CAP + 1, 0), (0, 0), (40, 1)],
    ids=["header-over-the-cap", "empty-header", "any-payload"],
)
def test_a_first_frame_outside_the_hello_bounds_is_closed_unread(
    listener, pool, declared, payload_size
) -> None:
    future = accepting(pool, listener)
    bad = intruder(listener)
    bad.sendall(frame(b" " * 40, payload_size, header_size=declared))
    assert_closed(bad)
    genuine(listener, future)


def flood(sock: socket.socket, data: bytes) -> threading.Thread:
    """Send ``data`` until the listener hangs up."""

    def send() -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("declares", ["payload-1GiB", "header-64MiB"])
def test_huge_declared_lengths_before_the_token_cost_no_memory(listener, pool, declares) -> None:
    hello = json.dumps({"op": "hello", "token": "guess"}).encode()
    if declares == "payload-1GiB":
        data = FRAME.pack(len(hello), 1 << 30) + hello + b"\0" * (64 << 20)
    else:
        data = FRAME.pack(64 << 20, 0) + b" " * (64 << 20)
    bad = intruder(listener)  # all allocated before tracing starts
    tracemalloc.start()
    try:
        future = accepting(pool, listener)
        sender = flood(bad, data)
        sender.join(timeout=30)
        assert not sender.is_alive(), "the listener kept reading what the intruder declared"
        genuine(listener, future)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"accept allocated {peak} bytes for an unauthenticated frame"
    assert_closed(bad)


def test_a_silent_client_does_not_block_the_replica(listener, pool) -> None:
    future = accepting(pool, listener)
    silent = intruder(listener)
    time.sleep(0.2)
    genuine(listener, future)  # well within the silent client's 5 seconds
    silent.close()


@pytest.mark.parametrize("sends", ["nothing", "half-the-lengths", "half-the-header"])
def test_a_client_that_dawdles_is_timed_out(listener, pool, monkeypatch, sends) -> None:
    monkeypatch.setattr(channel_module, "HELLO_SECONDS", 0.4)
    # even the right token, too slowly
    hello = json.dumps({"op": "hello", "token": listener.token}).encode()
    whole = frame(hello)
    part = {
        "nothing": b"",
        "half-the-lengths": whole[:4],
        "half-the-header": whole[: 8 + len(hello) // 2],
    }[sends]
    future = accepting(pool, listener)
    slow = intruder(listener)
    slow.sendall(part)
    started = time.monotonic()
    assert_closed(slow, within=30)
    assert time.monotonic() - started > 0.3  # not before its deadline
    assert not future.done()
    genuine(listener, future)


def test_more_dawdlers_than_the_pending_cap_do_not_shut_out_the_replica(listener, pool) -> None:
    future = accepting(pool, listener)
    crowd = [intruder(listener) for _ in range(PENDING_CAP + 20)]
    genuine(listener, future)
    for sock in crowd[:10]:  # the oldest were dropped to make room
        assert_closed(sock)
    for sock in crowd[10:]:
        sock.close()


def test_the_wait_callback_still_runs_and_gives_up_while_a_client_dawdles(listener) -> None:
    silent = intruder(listener)
    calls: list[float] = []

    def wait() -> None:
        calls.append(time.monotonic())
        if len(calls) >= 3:
            raise ChannelClosed("the replica exited")

    started = time.monotonic()
    with pytest.raises(ChannelClosed, match="exited"):
        listener.accept(wait)
    # about every half second: never sooner, later under load
    assert time.monotonic() - started > 0.9
    silent.close()


def test_giving_up_while_a_replica_is_half_greeted_is_not_taken_for_its_failure(
    listener, pool
) -> None:
    calls: list[float] = []

    def wait() -> None:  # gives up once, at its third call (a swallowed give-up would never end)
        calls.append(time.monotonic())
        if len(calls) == 3:
            raise ChannelClosed("the replica exited")
        if len(calls) > 20:
            raise ChannelClosed("the first give-up was swallowed")

    quiet = intruder(listener)
    # and no hello proper
    quiet.sendall(frame(json.dumps({"op": "hello", "token": listener.token}).encode()))
    with pytest.raises(ChannelClosed, match="exited"):
        listener.accept(wait)
    quiet.close()


def test_ranks_connecting_together_are_each_accepted(listener) -> None:
    replicas = [
        Channel.connect(listener.address, listener.token, {"rank": rank}) for rank in range(3)
    ]
    ranks = {listener.accept(gives_up_after(5))[1]["rank"] for _ in range(3)}
    assert ranks == {0, 1, 2}
    for replica in replicas:
        replica.close()


def test_a_large_hello_is_read_after_the_token(listener, pool) -> None:
    structure = {
        "parameters": {f"layer{i}.weight": [[4096, 4096], "bfloat16"] for i in range(20000)}
    }
    future = accepting(pool, listener)
    Channel.connect(listener.address, listener.token, {"pid": 3, "structure": structure})
    _, hello = future.result(timeout=10)
    assert hello["structure"] == structure and "token" not in hello


# -- after the hello: what an authenticated peer can send
# -------------------------------------------


def pair() -> tuple[Channel, socket.socket]:
    ours, theirs = socket.socketpair()
    return Channel(ours, "replica"), theirs


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (frame(b"[1, 2]"), "not an object"),
        (frame(b"{oops"), "not valid JSON"),
        (frame(b"\xff\xff"), "not valid JSON"),
        (frame(b"[" * 100000), "not valid JSON"),
        (frame(b"{}", header_size=(64 << 20) + 1), "header"),
        (frame(b"{}", payload_size=10) + b"0123456789", "raw_size"),
        (frame(b'{"raw_size": "10"}', payload_size=10) + b"0123456789", "raw_size"),
        (frame(b'{"raw_size": true}', payload_size=10) + b"0123456789", "raw_size"),
        (frame(b'{"raw_size": -1}', payload_size=10) + b"0123456789", "raw_size"),
        (frame(b'{"raw_size": 10}', payload_size=10) + b"0123456789", "does not decode"),
    ],
    ids=[
        "list",
        "broken-json",
        "not-utf8",
        "deep",
        "huge-header",
        "no-raw-size",
        "str-raw-size",
        "bool-raw-size",
        "negative-raw-size",
        "not-zstd",
    ],
)
def test_a_frame_outside_the_protocol_closes_the_channel_in_one_line(data, problem) -> None:
    channel, peer = pair()
    peer.sendall(data)
    with pytest.raises(ChannelClosed, match=problem) as raised:
        channel.receive()
    assert "\n" not in str(raised.value) and str(raised.value).startswith("replica: ")
    assert channel.sock.fileno() == -1  # closed: nothing more is read from a stream out of step
    with pytest.raises(ChannelClosed):
        channel.receive()
    peer.close()


def test_a_progress_report_that_is_not_an_int_closes_the_channel() -> None:
    channel, peer = pair()
    Channel(peer).send({"progress": "lots"})
    with pytest.raises(ChannelClosed, match="progress"):
        channel.receive_reply(lambda: None, lambda done: None)
    peer.close()


def test_a_payload_declared_huge_is_not_allocated_up_front() -> None:
    channel, peer = pair()
    peer.sendall(frame(b'{"raw_size": 5}', payload_size=(1 << 32) - 1) + b"x" * 1000)
    peer.close()
    tracemalloc.start()
    try:
        with pytest.raises(ChannelClosed, match="closed"):
            channel.receive()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


def test_a_genuine_tree_still_round_trips() -> None:
    channel, peer = pair()
    tree = {"state": torch.arange(6.0).reshape(2, 3), "step": 4}
    Channel(peer).send({"op": "run"}, tree)
    header, back = channel.receive()
    assert header["op"] == "run" and back["step"] == 4 and torch.equal(back["state"], tree["state"])
    peer.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    header=st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda v: json.dumps(v).encode(),
            st.recursive(
                st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                lambda inner: (
                    st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["raw_size", "op", "x"]), inner, max_size=3)
                ),
                max_leaves=10,
            ),
        ),
    ),
    payload=st.binary(max_size=200),
)
def test_any_frame_is_either_received_or_closes_the_channel(header, payload) -> None:
    channel, peer = pair()
    try:
        peer.sendall(frame(header, len(payload)) + payload)
        try:
            received, _ = channel.receive()
        except ChannelClosed as closed:
            assert "\n" not in str(closed)
        else:
            assert isinstance(received, dict)
    finally:
        channel.close()
        peer.close()
