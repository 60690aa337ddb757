"""Field validators for the strict pydantic models read from JSON a store holds (``RuntimeConfig``, ``RoleRequest``).

Those models are strict (no coercion: what anyone can write to discovery is untrusted), but JSON has no enums and one
number type. These before-validators accept exactly what JSON gives for such a field, and nothing more; everything
else is left to strict validation:

    Annotated[E, json_enum(E)]                   a string -> ``E(string)`` (an unknown one fails as the enum's
                                                 ValueError); anything else as it is
    Annotated[tuple[E, ...], json_enums(E)]      a list or tuple -> a tuple, each string in it -> ``E(string)``
    JsonFloat                                    an integral number (not a bool) -> float
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, TypeVar

from pydantic import BeforeValidator

E = TypeVar("E", bound=Enum)


def json_enum(enum: type[E]) -> BeforeValidator:
    def from_str(value: object) -> object:
        return enum(value) if isinstance(value, str) else value

    return BeforeValidator(from_str)


def json_enums(enum: type[E]) -> BeforeValidator:
    def from_list(value: object) -> object:
        if isinstance(value, (list, tuple)):
            return tuple(enum(v) if isinstance(v, str) else v for v in value)
        return value

    return BeforeValidator(from_list)


def _integral_as_float(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


JsonFloat = Annotated[float, BeforeValidator(_integral_as_float)]
"""A float field that also takes an integral JSON number (``1`` for ``1.0``), never a bool."""
