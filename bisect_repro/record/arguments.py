"""A script's command line as its config: flag by flag, and the values ``argparse`` parsed from it.

:func:`capture_arguments` wraps ``argparse.ArgumentParser.parse_known_args`` (which ``parse_args``
calls) while a recorded script runs: the first parse of ``sys.argv`` fills the given mapping with
every argument's value, defaults included, keyed by its first long option (``--gamma``), else its
first option (``-g``), else its name (a positional argument). :func:`argv_flags` reads a command
line flag by flag, for scripts that parse it otherwise: ``--name value``, ``--name=value``,
``--flag`` (``True``) and positional words (``argv[1]``).

Values that are not JSON scalars (or lists of them) are kept as their ``repr``. The value of an
argument whose name says it holds a secret (token, password, secret, key, credential) is kept as
``<redacted sha256:...>``: two runs with different secrets still differ, and neither is shown.

Where the guarantees stop: only parsers that parse ``sys.argv`` (``parse_args()`` with no list) are
read, and only the first such parse; a parse after the model's first forward pass comes too late
for the run's config. A flag's value is told from a positional word by its leading ``-``, so a
flag without a value followed by a positional word reads that word as its value.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

__all__ = [
    "argv_flags",
    "capture_arguments",
    "is_secret",
    "redacted",
    "shown_command",
    "shown_value",
]

_SECRET = re.compile(
    r"token|passw|secret|api[-_]?key|access[-_]?key|credential|auth", re.IGNORECASE
)
_SCALARS = (str, int, float, bool, type(None))


def is_secret(name: str) -> bool:
    """Whether an argument's name says it holds a secret."""
    return _SECRET.search(name) is not None


def shown_value(name: str, value: Any) -> Any:
    """A value as the config keeps it: JSON-able, and a secret redacted (see the module
    docstring)."""
    if isinstance(value, (list, tuple)):
        value = [v if isinstance(v, _SCALARS) else repr(v) for v in value]
    elif not isinstance(value, _SCALARS):
        value = repr(value)
    if is_secret(name) and value is not None:
        return f"<redacted sha256:{hashlib.sha256(repr(value).encode()).hexdigest()[:12]}>"
    return value


def _key(action: argparse.Action) -> str:
    longs = [o for o in action.option_strings if o.startswith("--")]
    return (longs or list(action.option_strings) or [action.dest])[0]


def parsed_values(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> dict[str, Any]:
    """Every argument of ``parser`` with its value in ``namespace`` (see the module docstring)."""
    found = {}
    for action in parser._actions:
        if (
            isinstance(action, (argparse._HelpAction, argparse._VersionAction))
            or action.dest is argparse.SUPPRESS
        ):
            continue
        if hasattr(namespace, action.dest):
            key = _key(action)
            found[key] = shown_value(key, getattr(namespace, action.dest))
    return found


def capture_arguments(into: MutableMapping[str, Any]) -> Callable[[], None]:
    """Fill ``into`` from the first parse of ``sys.argv`` from now on; the function that undoes
    it."""
    original = argparse.ArgumentParser.parse_known_args

    def parse_known_args(
        parser: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        result = original(parser, args, namespace)
        if args is None and not into:
            try:
                into.update(parsed_values(parser, result[0]))
            except Exception:
                into.clear()
        return result

    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign,assignment]

    def undo() -> None:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]

    return undo


def argv_flags(argv: Sequence[str]) -> dict[str, Any]:
    """A command line's arguments (less ``argv[0]``), flag by flag (see the module docstring)."""
    found: dict[str, Any] = {}
    words, position = list(argv[1:]), 1
    while words:
        word = words.pop(0)
        if word == "--":
            for rest in words:
                found[f"argv[{position}]"] = rest
                position += 1
            break
        if not word.startswith("-") or _number(word):
            found[f"argv[{position}]"] = word
            position += 1
            continue
        name, given, value = word.partition("=")
        if given:
            found[name] = shown_value(name, value)
        elif words and (not words[0].startswith("-") or _number(words[0])):
            found[name] = shown_value(name, words.pop(0))
        else:
            found[name] = True
    return found


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def redacted(words: Sequence[str]) -> list[str]:
    """Command-line words with the value of each secret's flag (``--api-token X``, ``--password=X``)
    replaced by ``REDACTED``."""
    shown, hide = [], False
    for word in words:
        name, given, _ = word.partition("=")
        if hide:
            word, hide = "REDACTED", False
        elif word.startswith("-") and is_secret(name):
            word, hide = (f"{name}=REDACTED", False) if given else (word, True)
        shown.append(word)
    return shown


def shown_command(argv: Sequence[str]) -> str:
    """A command line (less ``argv[0]``) as shown: quoted as a shell would need, control characters
    escaped, secrets redacted (:func:`redacted`)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in shlex.join(redacted(argv[1:])))
