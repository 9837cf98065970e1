"""The mirror's errors: one tree, so a caller catches the base or the one it answers differently.

::

    MirrorError                         base: the mirror cannot do what it was set up for
    ├── MirrorConfigError (ValueError)  settings that cannot work (a sentence per problem)
    ├── KafkaSinkError                  the Kafka sink cannot start (its spool folder is unusable)
    ├── SpoolError                      the spool folder cannot be used (not a directory,
    │                                   unreadable cursor, in use by another process)
    └── MetricsParseError (ValueError)  an engine's ``/metrics`` body is not in its flavor's format

Each is importable from the module that raises it, too. Everything else the mirror meets
(engines down, slow, answering errors) is recorded, not raised.
"""

from __future__ import annotations


class MirrorError(Exception):
    """The mirror cannot do what it was set up for; the message says why."""


class MirrorConfigError(MirrorError, ValueError):
    """Settings that cannot work; the message lists what to fix."""


class KafkaSinkError(MirrorError):
    """The Kafka sink cannot start."""


class SpoolError(MirrorError):
    """The spool folder cannot be used."""


class MetricsParseError(MirrorError, ValueError):
    """An engine's ``/metrics`` body is not in the format of its flavor."""
