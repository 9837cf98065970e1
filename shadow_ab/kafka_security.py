"""How every Kafka client of the project authenticates and encrypts: TLS and SASL (SCRAM).

One set of environment variables, read by the mirror's producer, the ingester's consumer and
dead-letter producer, and the topic admin, so a cluster that requires TLS and SCRAM (Strimzi's
``tls: true`` listener with ``authentication: scram-sha-512``, k8s/README.md) is reached the
same way by all of them:

- ``SHADOW_AB_KAFKA_SECURITY_PROTOCOL``: ``PLAINTEXT`` (default), ``SSL``, ``SASL_PLAINTEXT``
  or ``SASL_SSL``;
- ``SHADOW_AB_KAFKA_SASL_MECHANISM``: ``SCRAM-SHA-512`` (default with SASL), ``SCRAM-SHA-256``
  or ``PLAIN``;
- ``SHADOW_AB_KAFKA_SASL_USERNAME``: the SASL user (a Strimzi KafkaUser's name);
- ``SHADOW_AB_KAFKA_SASL_PASSWORD``, or ``SHADOW_AB_KAFKA_SASL_PASSWORD_FILE`` naming a file
  holding it (a mounted Secret);
- ``SHADOW_AB_KAFKA_SSL_CAFILE``: the CA bundle that signed the brokers' certificates
  (Strimzi's cluster CA, ``ca.crt``);
- ``SHADOW_AB_KAFKA_SSL_CERTFILE`` and ``SHADOW_AB_KAFKA_SSL_KEYFILE``: a client certificate and
  key (mutual TLS), optional.

:func:`kafka_security` reads and checks them (keyword-style names, kafka-python's, the client
before), :func:`librdkafka_security` turns them into librdkafka's (confluent-kafka's)
configuration properties, which every Kafka client of the project is built with.

Errors: :class:`ValueError` with a sentence naming the variable to fix.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PREFIX = "SHADOW_AB_KAFKA_"
VARIABLES = frozenset(
    PREFIX + name
    for name in (
        "SECURITY_PROTOCOL",
        "SASL_MECHANISM",
        "SASL_USERNAME",
        "SASL_PASSWORD",
        "SASL_PASSWORD_FILE",
        "SSL_CAFILE",
        "SSL_CERTFILE",
        "SSL_KEYFILE",
    )
)
"""Every variable :func:`kafka_security` reads."""
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


def _readable(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(PREFIX + name)
    if not value:
        return None
    if not os.access(value, os.R_OK):
        raise ValueError(f"{PREFIX}{name}: cannot read {value} (mount it, or unset the variable)")
    return value


def kafka_security(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """kafka-python keyword arguments (``security_protocol``, ``sasl_*``, ``ssl_*``) from the
    environment (``env``, default ``os.environ``); empty for a plain-text cluster."""
    env = os.environ if env is None else env
    protocol = (env.get(PREFIX + "SECURITY_PROTOCOL") or "PLAINTEXT").strip().upper()
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"{PREFIX}SECURITY_PROTOCOL={protocol!r} is not one of {', '.join(PROTOCOLS)}"
        )
    if protocol == "PLAINTEXT":
        return {}
    out: dict[str, Any] = {"security_protocol": protocol}
    if protocol.startswith("SASL"):
        mechanism = (env.get(PREFIX + "SASL_MECHANISM") or MECHANISMS[0]).strip().upper()
        if mechanism not in MECHANISMS:
            raise ValueError(
                f"{PREFIX}SASL_MECHANISM={mechanism!r} is not one of {', '.join(MECHANISMS)}"
            )
        username = env.get(PREFIX + "SASL_USERNAME")
        password = env.get(PREFIX + "SASL_PASSWORD")
        password_file = _readable(env, "SASL_PASSWORD_FILE")
        if password_file is not None:
            password = Path(password_file).read_text().strip()
        if not username or not password:
            raise ValueError(
                f"{protocol} needs {PREFIX}SASL_USERNAME and {PREFIX}SASL_PASSWORD (or"
                f" {PREFIX}SASL_PASSWORD_FILE): the KafkaUser's name and password"
            )
        out.update(
            sasl_mechanism=mechanism, sasl_plain_username=username, sasl_plain_password=password
        )
    if protocol.endswith("SSL"):
        cafile = _readable(env, "SSL_CAFILE")
        if cafile is not None:
            out["ssl_cafile"] = cafile
        certfile, keyfile = _readable(env, "SSL_CERTFILE"), _readable(env, "SSL_KEYFILE")
        if (certfile is None) != (keyfile is None):
            raise ValueError(
                f"mutual TLS needs both {PREFIX}SSL_CERTFILE and {PREFIX}SSL_KEYFILE (or neither)"
            )
        if certfile is not None:
            out.update(ssl_certfile=certfile, ssl_keyfile=keyfile)
        out["ssl_check_hostname"] = True
    return out


LIBRDKAFKA_NAMES = {
    "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanism",
    "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password",
    "ssl_cafile": "ssl.ca.location",
    "ssl_certfile": "ssl.certificate.location",
    "ssl_keyfile": "ssl.key.location",
}
"""kafka-python keyword -> librdkafka property, for every keyword :func:`kafka_security` sets
(``ssl_check_hostname`` apart)."""


def librdkafka_security(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The same settings as :func:`kafka_security`, as librdkafka configuration properties
    (``security.protocol``, ``sasl.*``, ``ssl.*``), for confluent-kafka's clients; empty for
    a plain-text cluster. Without ``SHADOW_AB_KAFKA_SSL_CAFILE`` the system's CA certificates
    are used (``ssl.ca.location=probe``), as kafka-python does; the broker's host name is
    checked against its certificate (``ssl.endpoint.identification.algorithm=https``)."""
    out: dict[str, str] = {}
    for key, value in kafka_security(env).items():
        if key == "ssl_check_hostname":
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        else:
            out[LIBRDKAFKA_NAMES[key]] = str(value)
    if out.get("security.protocol", "PLAINTEXT").endswith("SSL"):
        out.setdefault("ssl.ca.location", "probe")
    return out
