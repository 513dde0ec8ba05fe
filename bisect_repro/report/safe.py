"""Strings from a run, made safe to put in rich markup.

A run directory is hostile input: its target, config, paths, stream and tensor names, environment
values and the notes made from them reach the terminal through rich, which reads ``[red]`` in a
string as markup and passes an ``ESC`` on to the terminal. :func:`safe_text` is the one way a
rendering puts such a string into markup: control characters (C0, DEL, C1, line separators and
bidirectional overrides) become visible escapes (``\\x1b``, by
:func:`bisect_repro.store.printable.printable`), then markup is escaped, so ``[red]`` prints as
those five characters.
"""

from __future__ import annotations

from rich.markup import escape

from ..store.printable import printable

__all__ = ["safe_text"]


def safe_text(value: object) -> str:
    """``str(value)`` to embed in rich markup: printed as written, never styled, never a control
    sequence."""
    return escape(printable(value))
