"""The JSON forms of the typed results: the helpers each ``to_json`` and ``from_json`` share.

A result's ``to_json`` names its keys one by one (:func:`plain_fields` for the fields written as
they are); a result whose JSON form holds its fields as they are reads back field by field
(:class:`ReadBack`), a key the dataclass does not know being left out (:func:`known_fields`).

Where the guarantees stop: reading back checks no type; a JSON object missing a field that has no
default raises ``TypeError``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, TypeVar

__all__ = ["ReadBack", "known_fields", "plain_fields"]


def plain_fields(obj: object, *names: str) -> dict[str, Any]:
    """The named attributes of ``obj``, in that order: a JSON form's fields that need no
    conversion."""
    return {name: getattr(obj, name) for name in names}


def known_fields(
    cls: type, found: Mapping[str, Any], *, but: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The items of ``found`` that are fields of the dataclass ``cls`` (less ``but``)."""
    names = {f.name for f in fields(cls)} - set(but)
    return {key: value for key, value in found.items() if key in names}


_ReadT = TypeVar("_ReadT", bound="ReadBack")


class ReadBack:
    """A dataclass whose JSON form holds its fields as they are, so it reads back field by field."""

    @classmethod
    def from_json(cls: type[_ReadT], found: Mapping[str, Any]) -> _ReadT:
        return cls(**known_fields(cls, found))
