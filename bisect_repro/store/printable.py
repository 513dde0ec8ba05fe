"""Text from a run, made safe to show: what a terminal or a page receives is what the run says,
visibly.

A run directory is hostile input, and its strings (argv, paths, config values, stream names,
file names) reach the terminal in the replay announcement, the reports and the errors, and a page
in the HTML reports. :func:`printable` is the one function that makes such text safe for a
terminal, and :func:`html_text` the one for HTML (the same, then HTML-escaped). Every character
of these kinds is written as a visible escape (``\\x1b``, ``\\u200b``, ``\\udc9b``):

- C0 controls, DEL and C1 controls (an ``ESC[2K`` could erase the line above it, and the single
  byte 0x9b is a CSI on an 8-bit terminal);
- lone surrogates, which is how Python holds bytes that are not UTF-8 (a folder name with the
  byte 0x9b is ``\\udc9b``): a strict UTF-8 stream cannot even encode them;
- the Unicode format characters (Cf: zero-width spaces and joiners, bidirectional marks and
  overrides, U+2060, U+061C) and the line and paragraph separators (Zl, Zp), which hide or
  reorder what is shown.

The result is ASCII-safe wherever the input was not printable, so it encodes on any stream.
"""

from __future__ import annotations

import re
import unicodedata
from html import escape

__all__ = ["html_text", "printable"]

_SUSPECT = re.compile(r"[^\x20-\x7e]")
_HIDDEN = frozenset({"Cc", "Cs", "Cf", "Zl", "Zp"})


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if unicodedata.category(char) not in _HIDDEN:
        return char
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def printable(text: object) -> str:
    """``text`` with every control, surrogate, format or separator character written as an escape
    (``\\x1b``)."""
    return _SUSPECT.sub(_escaped, str(text))


def html_text(text: object) -> str:
    """``text`` for HTML: :func:`printable`, then ``&``, ``<``, ``>`` and quotes escaped."""
    return escape(printable(text), quote=True)
