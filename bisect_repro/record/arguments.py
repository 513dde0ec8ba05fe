"""A script's command line as its config: flag by flag, and the values ``argparse`` parsed from it.

A script's config is its command line, whatever parses it. :func:`argv_flags` reads a command
line flag by flag: ``--name value``, ``--name=value``, ``--flag`` (``True``), ``name=value``
overrides (Hydra's, OmegaConf's: key ``name``) and other positional words (``argv[1]``).
:func:`capture_arguments` wraps ``argparse.ArgumentParser.parse_known_args`` (which
``parse_args`` calls) while a recorded script runs: every parse of words of the command line
(``sys.argv``, or what an earlier ``parse_known_args`` left of it: a config parser read first,
then the main one on the rest) adds every argument's value, defaults included, keyed by its
first long option (``--gamma``), else its first option (``-g``), else its name (a positional
argument); a later parse's value of a key wins. The config is then those values, and the flags
of the command line that no parser seen took (a flag read by ``fire``, ``click`` or by hand).

Values that are not JSON scalars (or lists of them) are kept as their ``repr``. The value of an
argument whose name says it holds a secret (token, password, secret, key, credential) is kept as
``<redacted sha256:...>``: two runs with different secrets still differ, and neither is shown.

Where the guarantees stop: a parser's values are read only where it parses words of the command
line; a parse after the model's first forward pass comes too late for the run's config. A flag's
value is told from a positional word by its leading ``-``, so a flag without a value followed by
a positional word reads that word as its value (a parser seen reads it rightly).
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shlex
import sys
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
# a Hydra or OmegaConf override: key=value, with ++/+/~ prefixes and dotted keys
_OVERRIDE = re.compile(r"^([+~]{0,2}[A-Za-z_][\w.\-/@]*)=(.*)$", re.DOTALL)


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


def _actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [
        action
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._VersionAction))
        and action.dest is not argparse.SUPPRESS
    ]


def parsed_values(parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> dict[str, Any]:
    """Every argument of ``parser`` with its value in ``namespace`` (see the module docstring)."""
    found = {}
    for action in _actions(parser):
        if hasattr(namespace, action.dest):
            key = _key(action)
            found[key] = shown_value(key, getattr(namespace, action.dest))
    return found


def _within(given: Sequence[str], words: Sequence[str]) -> bool:
    """Whether ``given`` are words of ``words``, in their order (what a parse left of them)."""
    remaining = iter(words)
    return all(any(word == other for other in remaining) for word in given)


class _Arguments:
    """What the parses of one command line read (see :func:`capture_arguments`)."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.words = [str(word) for word in argv[1:]]
        self.values: dict[str, Any] = {}
        self.options: set[str] = set()  # every option string of a parser seen
        self.positional = False  # a parser seen took positional arguments

    def add(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace) -> None:
        self.values.update(parsed_values(parser, namespace))
        for action in _actions(parser):
            self.options.update(action.option_strings)
            self.positional = self.positional or not action.option_strings

    def config(self) -> dict[str, Any]:
        """The parsed values, with the command line's flags that no parser seen took."""
        flags = {
            key: value
            for key, value in argv_flags(["", *self.words]).items()
            if key not in self.options and not (self.positional and key.startswith("argv["))
        }
        return {**flags, **self.values}


def capture_arguments(
    into: MutableMapping[str, Any], argv: Sequence[str] | None = None
) -> Callable[[], None]:
    """Fill ``into`` with the config of the command line ``argv`` (``sys.argv`` as it is now):
    its flags at once, then every parse of its words from now on; the function that undoes it."""
    original = argparse.ArgumentParser.parse_known_args
    seen = _Arguments(sys.argv if argv is None else argv)
    into.update(seen.config())

    def parse_known_args(
        parser: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None
    ) -> Any:
        result = original(parser, args, namespace)
        given = seen.words if args is None else args
        if isinstance(given, (list, tuple)) and _within([str(w) for w in given], seen.words):
            try:
                seen.add(parser, result[0])
                into.clear()
                into.update(seen.config())
            except Exception:  # a parser or namespace of an odd shape: the flags stay
                pass
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
        override = _OVERRIDE.match(word)
        if override is not None:
            found[override.group(1)] = shown_value(override.group(1), override.group(2))
            continue
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
