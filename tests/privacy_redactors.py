"""Redactors named by ``module:function`` in the privacy tests (importable from tests/)."""

from __future__ import annotations

NOT_CALLABLE = "not a function"


def upper(text: str) -> str:
    return text.upper()


def returns_none(text: str) -> None:
    return None


def mark(text: str) -> str:
    return text.replace("Paris", "[CITY]")


def broken(text: str) -> str:
    if text == "probe":
        return text
    raise RuntimeError(f"the redactor's own bug on {text!r}")
