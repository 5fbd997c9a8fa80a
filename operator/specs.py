"""Reading a ``StreamingASRPool`` spec field by its path, and the one error for a spec
the operator cannot use.

A :class:`Section` is one object of the spec and the path it was read at (``spec``,
``spec.model.cache``, ``spec.autoscaling.behavior.scaleUp.policies[0]``). Its readers
check a field's type and name the field's full path in :class:`InvalidSpec`, so a nested
section's messages never build their prefix by hand. Left out reads as the default: a
text ``None`` or ``""``, a number absent, an object or a list any empty value. What a
field means (its enums, the rules across fields) is for the module that reads it
(:mod:`~asrpool.operator.pools`, :mod:`~asrpool.operator.sources`,
:mod:`~asrpool.operator.templates`); this module owns how a field is read and how a
refusal of it is worded. Some readers take ``got=False``: their message ends without the
value found, as those fields' messages always have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from asrpool.common import crd


class InvalidSpec(ValueError):
    """The pool cannot be built as written; the message names the field and the fix."""


@dataclasses.dataclass(frozen=True)
class Section:
    """One object of the spec where it was read: ``Section("spec", body["spec"])``."""

    path: str
    raw: Mapping[str, Any]

    def at(self, field: str) -> str:
        """A field's full path: ``spec.model`` and ``cache`` are ``spec.model.cache``."""
        return f"{self.path}.{field}"

    def error(self, field: str, what: str) -> InvalidSpec:
        """A refusal of one field: ``spec.model.volume.hostPath must be absolute, ...``."""
        return InvalidSpec(f"{self.at(field)} {what}")

    def invalid(self, what: str) -> InvalidSpec:
        """A refusal of the section as a whole: ``spec.model needs exactly one of ...``."""
        return InvalidSpec(f"{self.path} {what}")

    def get(self, field: str, default: Any = None) -> Any:
        """A field's value as written, unchecked (``default`` when absent)."""
        return self.raw.get(field, default)

    def __contains__(self, field: object) -> bool:
        return field in self.raw

    def text(self, field: str, *, required: bool = False, got: bool = True) -> str:
        """A string; ``""`` when left out (unless required)."""
        value = self.raw.get(field)
        if value is None or value == "":
            if required:
                raise self.error(field, "is required")
            return ""
        if not isinstance(value, str):
            raise self.error(field, "must be a string" + _got(got, repr(value)))
        return value

    def integer(self, field: str, default: int = 0, *, required: bool = False,
                minimum: int = 0) -> int:
        """A whole number (not a boolean) at least ``minimum``; ``default`` when absent."""
        if field not in self.raw:
            if required:
                raise self.error(field, "is required")
            return default
        value = self.raw[field]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(field, f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.error(field, f"must be at least {minimum}, got {value}")
        return value

    def optional_integer(self, field: str) -> int | None:
        """A whole number, at least 0; None when absent or null."""
        return None if self.raw.get(field) is None else self.integer(field)

    def boolean(self, field: str, *, got: bool = True) -> bool:
        """``true`` or ``false``; false when absent (but not when null)."""
        value = self.raw.get(field, False)
        if not isinstance(value, bool):
            raise self.error(field, "must be true or false" + _got(got, repr(value)))
        return value

    def section(self, field: str, *, got: bool = True) -> Section:
        """An object, read at its own path; left out (or any empty value) reads as ``{}``."""
        return self._object(field, self.raw.get(field) or {}, got)

    def optional_section(self, field: str, *, got: bool = True) -> Section | None:
        """An object that may be left out (None, also when null); given, it must be one."""
        value = self.raw.get(field)
        return None if value is None else self._object(field, value, got)

    def _object(self, field: str, value: Any, got: bool) -> Section:
        if not isinstance(value, Mapping):
            raise self.error(field, "must be an object" + _got(got, type(value).__name__))
        return Section(self.at(field), value)

    def defaulted(self, field: str, schema: crd.Schema, *, got: bool = True) -> Section:
        """An object the spec may leave out, read with its own fields' defaults all the
        same (``schema`` is this section's): what the operator assumes of it when it is
        absent, where the API server defaults inside an object only where it is written."""
        read = self.section(field, got=got)
        return Section(read.path, crd.defaulted(crd.at(schema, field), read.raw))

    def mapping(self, field: str) -> dict[str, Any]:
        """An object passed through as it is (a copy): ``nodeSelector``, ``affinity``."""
        return dict(self.section(field).raw)

    def sections(self, field: str) -> tuple[Section, ...]:
        """A list of objects, each read at ``field[i]``; left out reads as empty."""
        value = self.raw.get(field) or []
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            raise self.error(field, "must be a list of objects")
        return tuple(Section(f"{self.at(field)}[{index}]", item)
                     for index, item in enumerate(value))

    def objects(self, field: str) -> tuple[dict[str, Any], ...]:
        """A list of objects passed through as they are (copies): ``tolerations``."""
        return tuple(dict(item.raw) for item in self.sections(field))

    def strings(self, field: str) -> dict[str, str]:
        """An object of string values (labels, annotations); left out reads as ``{}``."""
        value = self.raw.get(field) or {}
        if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
            raise self.error(field, "must map names to strings")
        return dict(value)


def _got(shown: bool, found: str) -> str:
    return f", got {found}" if shown else ""
