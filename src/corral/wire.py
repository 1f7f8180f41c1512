"""What any value from a peer must be before corral stores it, and the base of wire models.

JSON can carry values no database column or JSON answer can hold again: a lone surrogate
(``"\\ud800"``) is stored but cannot be encoded as UTF-8 when it is read back, so every
listing that includes it fails; PostgreSQL text cannot hold NUL; integers have 64 bits in
both databases; ``NaN`` is not JSON at all. ``WireModel`` refuses them in every field,
however deeply nested, with one check, so a new field is covered without a second thought.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from corral.errors import InvalidRequest

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
# NUL, or any UTF-16 surrogate: in a Python str taken from JSON it can only be a lone one.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

# Integers of the two column types (``INTEGER`` has 32 bits on PostgreSQL), with their
# bounds in the OpenAPI document too.
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Int32 = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


def check_parameters(pairs: Iterable[tuple[str, str]]) -> None:
    """Path and query values reach SQL as bound text too: refuse (``invalid_request``)
    what bodies may not hold."""
    for name, value in pairs:
        if why := problem_with(name) or problem_with(value):
            raise InvalidRequest(f"{name!r}: {why}")


def problem_with(value: Any) -> str | None:
    """Why ``value`` (decoded JSON, or a model's field) cannot be stored; None if it can."""
    kind = type(value)
    if kind is str:
        bad = _UNSTORABLE.search(value)
        if bad is None:
            return None
        return "text contains NUL" if bad.group() == "\x00" else "text contains a lone surrogate"
    if kind is float:
        return None if math.isfinite(value) else "number is not finite"
    if kind is int:
        return None if INT64_MIN <= value <= INT64_MAX else "integer out of 64-bit range"
    # Lists and objects as JSON decodes them, before the checks below: ``BaseModel`` and
    # ``Mapping`` are ABCs, and their isinstance checks were half of a created run's check.
    if kind is list:
        for item in value:
            if why := problem_with(item):
                return why
        return None
    if kind is dict:
        for key, item in value.items():
            if why := problem_with(key) or problem_with(item):
                return why
        return None
    if value is None or kind is bool or isinstance(value, BaseModel):
        return None  # a nested model checked its own fields
    if isinstance(value, str):
        return problem_with(str(value))  # an enum's value, a subclass
    if isinstance(value, int):
        return problem_with(int(value))
    if isinstance(value, float):
        return problem_with(float(value))
    if isinstance(value, Mapping):
        for key, item in value.items():
            why = problem_with(key) or problem_with(item)
            if why:
                return why
        return None
    if isinstance(value, list | tuple):
        for item in value:
            why = problem_with(item)
            if why:
                return why
    return None


class WireModel(BaseModel):
    """A request body or message: unknown fields refused, every value storable."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="after")
    def _storable(self) -> WireModel:
        for name, value in self.__dict__.items():  # the fields, as validated
            if value is None:  # most fields of most messages: not worth a call each
                continue
            why = problem_with(value)
            if why:
                raise ValueError(f"{name}: {why}")
        return self
