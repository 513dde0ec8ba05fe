"""The control channel between ``compare`` (or ``doctor``) and a process that replays a run.

A replay runs in its own process: the recorded script or recipe, relaunched with
``BISECT_REPRO_REPLAY`` set, whose :class:`~bisect_repro.record.recorder.Recorder` then serves
requests instead of recording (see :mod:`bisect_repro.record.serve`). The controller listens on a
Unix socket in a private folder (mode 0700); each replaying process (one per rank under torchrun)
connects, proves it was started by the controller with a random token, and then answers one
request at a time.

A message is a frame: two big-endian 32-bit lengths, a JSON object, and an optional payload, a
state tree encoded by :mod:`bisect_repro.store.codec` (safetensors + zstandard). Nothing is ever
pickled in either direction, so a replaying process can send tensors and random-stream states
but never code.

Where the guarantees stop: the socket is private to this user (its folder's mode), not to this
process; the token keeps other processes of the same user from being taken for a replica by
accident, not by an attacker who can read this process's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import BisectReproError
from ..store import codec

__all__ = ["ADDRESS_VARIABLE", "TOKEN_VARIABLE", "Channel", "ChannelClosed", "Listener", "replay_address"]

ADDRESS_VARIABLE = "BISECT_REPRO_REPLAY"
TOKEN_VARIABLE = "BISECT_REPRO_REPLAY_TOKEN"
_FRAME = struct.Struct("!II")
_MAX_HEADER = 64 << 20


class ChannelClosed(BisectReproError):
    """The other end went away (the replaying process exited, or the controller did)."""


def replay_address() -> tuple[str, str] | None:
    """``(address, token)`` when this process was started to replay a run, else ``None``."""
    address = os.environ.get(ADDRESS_VARIABLE)
    return (address, os.environ.get(TOKEN_VARIABLE, "")) if address else None


class Channel:
    """One connection: send and receive frames (a JSON header and an optional state tree)."""

    def __init__(self, sock: socket.socket, name: str = "channel") -> None:
        self.sock = sock
        self.name = name

    @classmethod
    def connect(cls, address: str, token: str, hello: dict[str, Any]) -> Channel:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        channel = cls(sock, "controller")
        channel.send({"op": "hello", "token": token, **hello})
        return channel

    def send(self, header: dict[str, Any], tree: Any = None) -> None:
        payload = b""
        if tree is not None:
            payload, raw_size = codec.encode(tree, level=1)
            header = {**header, "raw_size": raw_size}
        text = json.dumps(header, allow_nan=True).encode()
        self.sock.sendall(_FRAME.pack(len(text), len(payload)) + text + payload)

    def receive(self, wait: Callable[[], None] | None = None) -> tuple[dict[str, Any], Any]:
        """The next frame; ``wait`` is called between socket timeouts (to notice a dead peer)."""
        lengths = self._read(_FRAME.size, wait)
        header_size, payload_size = _FRAME.unpack(lengths)
        if header_size > _MAX_HEADER:
            raise ChannelClosed(f"{self.name}: a frame declares a {header_size}-byte header; the peer is not a bisect-repro replica")
        header = json.loads(self._read(header_size, wait))
        tree = None
        if payload_size:
            payload = self._read(payload_size, wait)
            tree = codec.decode(payload, Path(self.name), raw_size=int(header.get("raw_size", -1)))
        return header, tree

    def receive_reply(self, wait: Callable[[], None], progress: Callable[[int], None] | None = None) -> tuple[dict[str, Any], Any]:
        """The reply to a request: the next frame that is not a progress report (those go to ``progress``)."""
        while True:
            reply, payload = self.receive(wait)
            if "progress" not in reply:
                return reply, payload
            if progress is not None:
                progress(int(reply["progress"]))

    def _read(self, size: int, wait: Callable[[], None] | None) -> bytes:
        chunks, left = [], size
        while left:
            try:
                chunk = self.sock.recv(min(left, 1 << 20))
            except TimeoutError:
                if wait is not None:
                    wait()
                continue
            if not chunk:
                raise ChannelClosed(f"{self.name}: the connection closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Listener:
    """A Unix socket in a private temporary folder, for the replaying processes to connect to."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="bisect-repro-"))  # mode 0700
        self.address = str(self.folder / "control.sock")
        self.token = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(64)
        self.sock.settimeout(0.5)

    def environment(self) -> dict[str, str]:
        """What a process needs in its environment to connect back."""
        return {ADDRESS_VARIABLE: self.address, TOKEN_VARIABLE: self.token}

    def accept(self, wait: Callable[[], None]) -> tuple[Channel, dict[str, Any]]:
        """The next process that connects with the right token, and its hello; ``wait`` is called
        every half second meanwhile (it raises to give up)."""
        while True:
            try:
                sock, _ = self.sock.accept()
            except TimeoutError:
                wait()
                continue
            sock.settimeout(0.5)
            channel = Channel(sock, "replica")
            try:
                hello, _ = channel.receive(wait)
            except (ChannelClosed, ValueError):
                channel.close()
                continue
            if hello.get("op") == "hello" and secrets.compare_digest(str(hello.get("token", "")), self.token):
                return channel, hello
            channel.close()

    def close(self) -> None:
        try:
            self.sock.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
