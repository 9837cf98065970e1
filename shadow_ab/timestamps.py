"""Timestamps are aware and in UTC: the two conversions every part uses.

- :func:`aware_utc`: a time that must carry its zone (a record's, an incident query's bounds,
  one written to the store); one without is refused (``ValueError`` naming it).
- :func:`as_utc`: a time that may leave its zone out, which then means UTC: what a person typed
  (a command-line option, an HTTP query parameter), and the windows the review is handed.

Times read from the store need neither: the store's timestamp columns hand them back aware,
in UTC, on PostgreSQL and SQLite alike (:class:`storage.models.UTCDateTime`).
"""

from __future__ import annotations

from datetime import UTC, datetime


def as_utc(ts: datetime) -> datetime:
    """``ts`` in UTC; a naive ``ts`` is taken to be UTC."""
    return ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)


def aware_utc(ts: datetime, name: str) -> datetime:
    """``ts`` in UTC; ``ValueError`` naming ``name`` when it carries no time zone."""
    if ts.tzinfo is None:
        raise ValueError(
            f"{name} must carry a timezone (ISO 8601 with 'Z' or an offset,"
            " e.g. 2026-11-30T00:00:00Z)"
        )
    return ts.astimezone(UTC)
