"""The store's errors in a command: one line saying what to do, and a distinct exit status.

Used by every command that reads or writes the store (``shadow-ab db``, ``report``,
``incidents``); the other shared click helpers are in :mod:`shadow_ab.cli_support`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from storage.errors import BadConfiguration, StorageError, StoreUnavailable

F = TypeVar("F", bound=Callable[..., Any])


def storage_errors(func: F) -> F:
    """Show storage errors as one line and a distinct exit status, not a traceback: 3 when the
    store is unreachable, 2 for a bad configuration, 1 for any other storage error."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StoreUnavailable as exc:
            click.echo(
                f"error: {exc} (is the database running? `shadow-ab services status`)", err=True
            )
            raise SystemExit(3) from exc
        except BadConfiguration as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(2) from exc
        except StorageError as exc:
            click.echo(f"error: {exc}", err=True)
            raise SystemExit(1) from exc

    return wrapper  # type: ignore[return-value]  # functools.wraps keeps the signature
