"""The replies of the replay protocol, read back at the controller's edge: one decoder for all.

Each request class names the class of its reply (``class Restore(Asks[Restored])``,
:mod:`bisect_repro.serve.requests`); :data:`REPLIES` is that, read off the classes, one row per
request. :func:`decode_reply` turns what a replaying process answered (a JSON object and the state
tree beside it) into that reply, typed: ``decode_reply(Restore(...), message, tree)`` is a
:class:`~bisect_repro.serve.protocol.Restored`. Nothing past
:meth:`~bisect_repro.replay.replica.Replica.request` sees a reply as a dict.

Where the guarantees stop: a reply ``{"error": ...}`` is not decoded (:class:`Refused`: the
replica turns it into its failure, naming the process); the fields of a reply are read as the
other end, this package at one version, wrote them, not checked one by one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast, get_args, get_origin

from .protocol import Reply, StepResult, StepStart
from .requests import REQUESTS, Asks, Request

__all__ = ["REPLIES", "Refused", "decode_reply"]

R = TypeVar("R")


class Refused(Exception):
    """The process answered ``{"error": ...}``: it could not serve the request (the message says
    why)."""


def _reply_class(request: type[Request]) -> type[Reply]:
    """The reply class a request class names in its base ``Asks[...]``."""
    for base in getattr(request, "__orig_bases__", ()):
        if get_origin(base) is Asks:
            reply: type[Reply] = get_args(base)[0]
            return reply
    raise TypeError(f"{request.__name__} names no reply: declare it as Asks[ReplyClass]")


REPLIES: dict[str, type[Reply]] = {op: _reply_class(cls) for op, cls in REQUESTS.items()}
"""Each request's reply class, by the request's ``op``, as the request classes declare it."""


def _json(cls: Any) -> Callable[[dict[str, Any], Any], Reply]:
    return lambda message, tree: cast(Reply, cls.from_json(message))


_DECODERS: dict[type[Reply], Callable[[dict[str, Any], Any], Reply]] = {
    **{cls: _json(cls) for cls in set(REPLIES.values())},
    StepResult: StepResult.from_reply,  # kept tensors in the tree
    # the states are the tree
    StepStart: lambda message, tree: StepStart.from_tree(tree if isinstance(tree, dict) else {}),
}
"""How each reply class reads a message and its tree: from the JSON object, but where named here."""


def decode_reply(request: Asks[R], message: Mapping[str, Any], tree: Any = None) -> R:
    """The typed reply to ``request`` that ``message`` (and its state ``tree``) stand for;
    :class:`Refused` for an error reply."""
    if "error" in message:
        raise Refused(str(message["error"]))
    cls = REPLIES[request.op]
    return cast(R, _DECODERS[cls](dict(message), tree))
