"""The control channel: frames carry JSON and state trees (never a pickle), and only a process
started with the listener's token is accepted."""

from __future__ import annotations

import socket
import threading

import pytest
import torch

from bisect_repro.serve.channel import Channel, ChannelClosed, Listener


def never_dies() -> None:
    pass


def test_a_frame_carries_json_and_a_tree_of_tensors_both_ways() -> None:
    listener = Listener()
    try:
        tree = {
            "streams": {"torch": {"kind": "torch", "state": torch.arange(5, dtype=torch.uint8)}},
            "kept": {"3": torch.ones(2, 2)},
        }
        replies: list = []

        def replica() -> None:
            channel = Channel.connect(listener.address, listener.token, {"pid": 1})
            request, received = channel.receive()
            channel.send({"echo": request["op"]}, received)
            replies.append(channel)

        thread = threading.Thread(target=replica)
        thread.start()
        channel, hello = listener.accept(never_dies)
        assert hello["pid"] == 1
        channel.send({"op": "run", "step": 3}, tree)
        reply, back = channel.receive(never_dies)
        thread.join()
        assert reply["echo"] == "run" and reply["raw_size"] > 0
        assert torch.equal(back["streams"]["torch"]["state"], tree["streams"]["torch"]["state"])
        assert torch.equal(back["kept"]["3"], torch.ones(2, 2))
        replies[0].close()
        with pytest.raises(ChannelClosed):
            channel.receive(never_dies)
    finally:
        listener.close()


def test_a_process_without_the_token_is_refused(tmp_path) -> None:
    listener = Listener()
    try:
        intruder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        intruder.connect(listener.address)
        Channel(intruder).send({"op": "hello", "token": "wrong"})
        honest = threading.Thread(
            target=lambda: Channel.connect(listener.address, listener.token, {"pid": 2})
        )
        honest.start()
        _, hello = listener.accept(never_dies)
        honest.join()
        assert hello["pid"] == 2  # the intruder's connection was dropped, not taken for a replica
    finally:
        listener.close()
    assert not (tmp_path / "control.sock").exists()


def test_waiting_gives_up_when_the_peer_dies() -> None:
    listener = Listener()

    def dead() -> None:
        raise ChannelClosed("the replica exited")

    try:
        with pytest.raises(ChannelClosed, match="exited"):
            listener.accept(dead)
    finally:
        listener.close()
