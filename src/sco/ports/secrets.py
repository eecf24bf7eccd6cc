"""Credentials from a secret store, and secret values that do not print."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class Secret:
    """A secret value that does not print: repr, str and format show stars."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value, for the one call that must send it."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret is not pickled")


@dataclass(frozen=True, slots=True)
class Credential:
    """Authentication fields for a provider (keystone `auth` keys), and until when
    they may be used. Empty fields: the provider's own configuration holds them."""

    fields: Mapping[str, Secret] = field(default_factory=dict)
    expires_at: float | None = None
    source: str = ""
    version: int | None = None  # the secret's version where it is kept (OpenBao KV v2)

    def revealed(self) -> dict[str, str]:
        return {k: v.reveal() for k, v in self.fields.items()}


class SecretSource(Protocol):
    def credential(self) -> Credential:
        """A credential valid now; the caller asks again before `expires_at`."""
        ...
