"""The mirror's errors: one tree, so a caller catches the base or the one it answers differently.

::

    MirrorError                         base: the mirror cannot do what it was set up for
    ├── MirrorConfigError (ValueError)  settings that cannot work (a sentence per problem)
    ├── KafkaSinkError                  the Kafka sink cannot start (its spool folder is unusable)
    ├── SpoolError                      the spool folder cannot be used (not a directory,
    │                                   unreadable cursor, in use by another process)
    ├── MetricsParseError (ValueError)  an engine's ``/metrics`` body is not in its flavor's format
    ├── ListenError                     a listening socket cannot be made or bound
    └── RedactionError                  the configured redactor failed on a record

Each is importable from the module that raises it, too. Everything else the mirror meets
(engines down, slow, answering errors, hostile bodies or answers) is recorded and counted, not
raised. What its parts raise and catch among themselves never leaves the mirror and is not in
the tree: :class:`mirror.shadow_client.AnswerTruncated` (caught by the shadow side, recorded)
and the Kafka producer's delivery outcomes (:mod:`mirror.kafka_confluent`, handled by the
sink).
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


class ListenError(MirrorError):
    """The socket could not be made or bound; the text says why and what to do."""


class RedactionError(MirrorError):
    """The configured redactor failed on a record."""
