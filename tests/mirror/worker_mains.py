"""Worker bodies for the supervisor's tests (tests/mirror/test_workers.py), in a module of their
own: a spawned worker imports the module its body lives in, and this one imports nothing."""

from __future__ import annotations

import sys
from typing import Any


def exits_at_once(settings: Any, verbose: bool) -> None:
    """A worker that cannot start (a port, a spool folder or a store it cannot open)."""
    sys.exit(3)
