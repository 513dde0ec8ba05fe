"""The control channel between ``compare`` (or ``doctor``) and a process that replays a run.

A replay runs in its own process: the recorded script or recipe, relaunched with
``BISECT_REPRO_REPLAY`` set, whose :class:`~bisect_repro.record.recorder.Recorder` then serves
requests instead of recording (see :mod:`bisect_repro.serve.server`). The controller listens on a
Unix socket in a private folder (mode 0700); each replaying process (one per rank under torchrun)
connects, proves it was started by the controller with a random token, and then answers one
request at a time.

A message is a frame: two big-endian 32-bit lengths, a JSON object, and an optional payload, a
state tree encoded by :mod:`bisect_repro.store.codec` (safetensors + zstandard). Nothing is ever
pickled in either direction, so a replaying process can send tensors and random-stream states
but never code.

A connection opens with two frames: first ``{"op": "hello", "token": ...}`` alone, then the
replica's hello proper (pid, rank, model structure: possibly megabytes), which the listener
reads only once the token has been checked.

Where the guarantees stop: the socket is private to this user (its folder's mode), not to this
process; the token keeps other processes of the same user from being taken for a replica, not an
attacker who can read this process's environment. Before the token is checked, a connection gets
at most :data:`HELLO_SECONDS` of wall time to send a first frame of at most
:data:`HELLO_HEADER_CAP` bytes of header and no payload; the listener reads exactly that much and
no more, so an unauthenticated peer costs at most that buffer and a file descriptor, and anything
else (another length, not a JSON object, another ``op``, a non-string or wrong token, silence,
half a frame) closes that connection while the listener goes on accepting: up to
:data:`PENDING_CAP` hellos are awaited at once, the oldest dropped beyond that, so a dawdling or
misbehaving client neither blocks nor crashes ``accept``. What is not guaranteed: a process that
keeps flooding the socket with connections can still delay (not deceive) the controller, and an
authenticated peer is trusted to the limits :meth:`Channel.receive` keeps, a header of at most
64 MiB and a payload decoded only by :func:`~bisect_repro.store.codec.decode` with its declared
size (capped at this machine's memory); any frame outside them ends the channel with
:class:`ChannelClosed`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import selectors
import shutil
import socket
import struct
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ..errors import BisectReproError, RunFormatError
from ..store import codec

__all__ = [
    "ADDRESS_VARIABLE",
    "HELLO_HEADER_CAP",
    "HELLO_SECONDS",
    "PENDING_CAP",
    "TOKEN_VARIABLE",
    "Channel",
    "ChannelClosed",
    "Listener",
    "replay_address",
]

ADDRESS_VARIABLE = "BISECT_REPRO_REPLAY"
TOKEN_VARIABLE = "BISECT_REPRO_REPLAY_TOKEN"
HELLO_HEADER_CAP = 4096  # bytes: the first frame, {"op": "hello", "token": <32 hex digits>}, is ~60
HELLO_SECONDS = 5.0  # wall time from accept for the first frame to arrive whole
PENDING_CAP = 64  # connections whose first frame is awaited at once (the listen backlog's size)
_WAIT_EVERY = 0.5  # seconds between calls of accept's ``wait``
_FRAME = struct.Struct("!II")
_MAX_HEADER = 64 << 20
_CHUNK = 1 << 20


class ChannelClosed(BisectReproError):
    """The other end went away (the replaying process exited, or the controller did), or broke the
    protocol."""


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
        """Connect to a :class:`Listener`: the token alone in a small first frame, then
        ``hello``."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
        channel = cls(sock, "controller")
        channel.send({"op": "hello", "token": token})
        channel.send(hello)
        return channel

    def send(self, header: dict[str, Any], tree: Any = None) -> None:
        payload = b""
        if tree is not None:
            payload, raw_size = codec.encode(tree)
            header = {**header, "raw_size": raw_size}
        text = json.dumps(header, allow_nan=True).encode()
        self.sock.sendall(_FRAME.pack(len(text), len(payload)) + text + payload)

    def receive(self, wait: Callable[[], None] | None = None) -> tuple[dict[str, Any], Any]:
        """The next frame; ``wait`` is called between socket timeouts (to notice a dead peer).

        A frame outside the protocol (a header over 64 MiB, not a JSON object, a payload without
        an int ``raw_size`` or that does not decode) closes the channel and raises
        :class:`ChannelClosed`."""
        header_size, payload_size = _FRAME.unpack(self._read(_FRAME.size, wait))
        if header_size > _MAX_HEADER:
            self._broken(
                f"a frame declares a {header_size}-byte header (at most {_MAX_HEADER}); the peer "
                "is not a bisect-repro replica"
            )
        try:
            header = json.loads(self._read(header_size, wait))
        # UnicodeDecodeError and JSONDecodeError are ValueErrors
        except (ValueError, RecursionError) as error:
            self._broken(f"a frame's header is not valid JSON ({error.__class__.__name__})")
        if not isinstance(header, dict):
            self._broken(f"a frame's header is a JSON {type(header).__name__}, not an object")
        tree = None
        if payload_size:
            raw_size = header.get("raw_size")
            if type(raw_size) is not int or raw_size < 0:
                self._broken(
                    f"a frame with a {payload_size}-byte payload declares no valid raw_size"
                )
            payload = self._read(payload_size, wait)
            try:
                tree = codec.decode(payload, Path(self.name), raw_size=raw_size)
            except RunFormatError as error:
                self._broken(f"a frame's payload does not decode ({error.problem})")
        return header, tree

    def receive_reply(
        self, wait: Callable[[], None], progress: Callable[[int], None] | None = None
    ) -> tuple[dict[str, Any], Any]:
        """The reply to a request: the next frame that is not a progress report (those go to
        ``progress``)."""
        while True:
            reply, payload = self.receive(wait)
            if "progress" not in reply:
                return reply, payload
            done = reply["progress"]
            if type(done) is not int:
                self._broken(f"a progress report says {str(done)[:40]!r}, not an int")
            if progress is not None:
                progress(done)

    def _broken(self, problem: str) -> NoReturn:
        """Close the channel (its stream is out of step) and raise a one-line
        :class:`ChannelClosed`."""
        self.close()
        raise ChannelClosed(f"{self.name}: {problem}")

    def _read(self, size: int, wait: Callable[[], None] | None) -> bytes:
        """``size`` bytes, read as they come in chunks of at most 1 MiB (never allocated up
        front)."""
        chunks, left = [], size
        while left:
            try:
                chunk = self.sock.recv(min(left, _CHUNK))
            except TimeoutError:
                if wait is not None:
                    wait()
                continue
            except OSError as error:
                raise ChannelClosed(
                    f"{self.name}: the connection failed ({error.strerror or error})"
                ) from None
            if not chunk:
                raise ChannelClosed(f"{self.name}: the connection closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


@dataclass
class _Pending:
    """An accepted connection whose first frame has not yet arrived whole."""

    sock: socket.socket
    deadline: float
    data: bytearray = field(default_factory=bytearray)
    needed: int = _FRAME.size  # bytes of the first frame in all, once its lengths are known


class Listener:
    """A Unix socket in a private temporary folder, for the replaying processes to connect to."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="bisect-repro-"))  # mode 0700
        self.address = str(self.folder / "control.sock")
        self.token = secrets.token_hex(16)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.address)
        self.sock.listen(PENDING_CAP)
        self.sock.setblocking(False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        # kept from one accept to the next (ranks connect together)
        self._pending: dict[socket.socket, _Pending] = {}
        self._authenticated: deque[socket.socket] = deque()

    def environment(self) -> dict[str, str]:
        """What a process needs in its environment to connect back."""
        return {ADDRESS_VARIABLE: self.address, TOKEN_VARIABLE: self.token}

    def accept(self, wait: Callable[[], None]) -> tuple[Channel, dict[str, Any]]:
        """The next process that connects with the right token, and its hello; ``wait`` is called
        every half second meanwhile (it raises to give up).

        Connections are served side by side: each has :data:`HELLO_SECONDS` from its accept to
        send its first frame, and one that sends anything but the right token's hello is closed,
        while the others go on."""
        next_wait = time.monotonic() + _WAIT_EVERY
        while True:
            while self._authenticated:
                found = self._hello(self._authenticated.popleft(), wait)
                if found is not None:
                    return found
            now = time.monotonic()
            if now >= next_wait:
                wait()
                next_wait = time.monotonic() + _WAIT_EVERY
            for pending in [p for p in self._pending.values() if p.deadline <= now]:
                self._drop(pending.sock)
            until = min([next_wait, *(p.deadline for p in self._pending.values())])
            for key, _ in self._selector.select(max(0.0, until - time.monotonic())):
                if key.fileobj is self.sock:
                    self._take()
                else:
                    pending = self._pending.get(key.fileobj)  # type: ignore[call-overload]
                    if pending is not None:  # not dropped by an accept in this same round
                        self._advance(pending)

    def _take(self) -> None:
        """Accept one connection into the pending set (dropping the oldest beyond
        :data:`PENDING_CAP`)."""
        try:
            sock, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        except OSError as error:
            if (
                error.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
                and self._pending
            ):
                # the oldest: a file descriptor back for the next try
                self._drop(next(iter(self._pending)))
                return
            raise ChannelClosed(
                f"listener: cannot accept a connection ({error.strerror or error})"
            ) from None
        if len(self._pending) >= PENDING_CAP:
            self._drop(next(iter(self._pending)))
        sock.setblocking(False)
        pending = self._pending[sock] = _Pending(sock, time.monotonic() + HELLO_SECONDS)
        self._selector.register(sock, selectors.EVENT_READ)
        self._advance(pending)  # a replica writes its hello as it connects: usually there already

    def _advance(self, pending: _Pending) -> None:
        """Read what has arrived of a first frame (never past it); judge it once whole."""
        try:
            chunk = pending.sock.recv(pending.needed - len(pending.data))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(pending.sock)
            return
        pending.data += chunk
        if len(pending.data) == _FRAME.size:
            header_size, payload_size = _FRAME.unpack(pending.data)
            if not 0 < header_size <= HELLO_HEADER_CAP or payload_size:
                self._drop(pending.sock)  # not a hello: never read (nor allocate) what it declares
                return
            pending.needed = _FRAME.size + header_size
        elif len(pending.data) == pending.needed:
            self._unregister(pending.sock)
            if self._token_matches(bytes(pending.data[_FRAME.size :])):
                self._authenticated.append(pending.sock)
            else:
                pending.sock.close()

    def _token_matches(self, text: bytes) -> bool:
        try:
            hello = json.loads(text)
        except (ValueError, RecursionError):
            return False
        if (
            not isinstance(hello, dict)
            or hello.get("op") != "hello"
            or not isinstance(hello.get("token"), str)
        ):
            return False
        # bytes: compare_digest refuses non-ASCII str
        token = hello["token"].encode("utf-8", "surrogatepass")
        return secrets.compare_digest(token, self.token.encode())

    def _hello(
        self, sock: socket.socket, wait: Callable[[], None]
    ) -> tuple[Channel, dict[str, Any]] | None:
        """An authenticated connection's hello proper (its second frame), or ``None`` if it
        broke."""
        sock.settimeout(_WAIT_EVERY)
        channel = Channel(sock, "replica")
        gave_up: list[BaseException] = []

        def waiting() -> None:
            try:
                wait()
            except BaseException as error:
                gave_up.append(error)
                raise

        try:
            hello, _ = channel.receive(waiting)
        except ChannelClosed:
            channel.close()
            if gave_up:  # wait's own ChannelClosed: giving up, not this connection's failure
                raise
            return None
        except BaseException:
            channel.close()
            raise
        return channel, {"op": "hello", **hello}

    def _unregister(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._unregister(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        try:
            for sock in [*self._pending, *self._authenticated]:
                self._drop(sock)
            self._authenticated.clear()
            self._selector.close()
            self.sock.close()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
