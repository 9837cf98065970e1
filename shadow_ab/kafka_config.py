"""Kafka client settings as a map of librdkafka properties, laid over the project's defaults.

Every Kafka client of the project is confluent-kafka's (librdkafka): the mirror's producer
(``kafka.client``, mirror/kafka_sink.py), the ingester's consumer
(``SHADOW_AB_INGEST_KAFKA_CONSUMER``, ingester/settings.py) and the topic admin. Their client
options are not declared again as settings one by one: a user gives a map of librdkafka
properties (https://github.com/confluentinc/librdkafka/blob/master/CONFIGURATION.md), which
:func:`client_config` lays over the component's defaults, after checking its keys:

- a key librdkafka does not know for that client (a producer or a consumer property, or a
  common one) is refused, with the closest known names;
- a key the component sets itself (its bootstrap servers, the acknowledgements its delivery
  guarantee rests on, its offset commits) is refused, saying which setting to use instead;
- TLS and SASL properties (``security.protocol``, ``ssl.*``, ``sasl.*``) are refused: they come
  from the ``SHADOW_AB_KAFKA_*`` variables for every client alike (:mod:`shadow_ab.kafka_security`),
  and secrets stay out of the settings files.

A key given under an alias of a default's property (``delivery.timeout.ms`` for
``message.timeout.ms``, ``linger.ms`` for ``queue.buffering.max.ms``) replaces that default.

The property names are librdkafka 2.16's (``rd_kafka_conf_properties_show``), deprecated ones
and the callbacks (set in code, never from settings) left out; tests/test_kafka_config.py
checks that the installed librdkafka knows each of them.

Errors: :class:`ValueError`, one sentence naming the key and what to do.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Literal

Value = str | int | float | bool
"""A librdkafka property's value as settings give it (librdkafka takes each as a string)."""

COMMON = frozenset(
    """
    allow.auto.create.topics api.version.request.timeout.ms bootstrap.servers
    broker.address.family broker.address.ttl builtin.features client.dns.lookup client.id
    client.rack connections.max.idle.ms debug enable.metrics.push enable.random.seed
    enable.sasl.oauthbearer.unsecure.jwt enable.ssl.certificate.verification enabled_events
    https.ca.location https.ca.pem internal.termination.signal log.connection.close log.queue
    log.thread.name log_level max.in.flight max.in.flight.requests.per.connection
    message.copy.max.bytes message.max.bytes metadata.broker.list metadata.max.age.ms
    metadata.recovery.rebootstrap.trigger.ms metadata.recovery.strategy plugin.library.paths
    receive.message.max.bytes reconnect.backoff.max.ms reconnect.backoff.ms
    retry.backoff.max.ms retry.backoff.ms sasl.kerberos.keytab sasl.kerberos.kinit.cmd
    sasl.kerberos.min.time.before.relogin sasl.kerberos.principal sasl.kerberos.service.name
    sasl.mechanism sasl.mechanisms sasl.oauthbearer.assertion.algorithm
    sasl.oauthbearer.assertion.claim.aud sasl.oauthbearer.assertion.claim.exp.seconds
    sasl.oauthbearer.assertion.claim.iss sasl.oauthbearer.assertion.claim.jti.include
    sasl.oauthbearer.assertion.claim.nbf.seconds sasl.oauthbearer.assertion.claim.sub
    sasl.oauthbearer.assertion.file sasl.oauthbearer.assertion.jwt.template.file
    sasl.oauthbearer.assertion.private.key.file
    sasl.oauthbearer.assertion.private.key.passphrase
    sasl.oauthbearer.assertion.private.key.pem sasl.oauthbearer.client.credentials.client.id
    sasl.oauthbearer.client.credentials.client.secret sasl.oauthbearer.client.id
    sasl.oauthbearer.client.secret sasl.oauthbearer.config sasl.oauthbearer.extensions
    sasl.oauthbearer.grant.type sasl.oauthbearer.metadata.authentication.type
    sasl.oauthbearer.method sasl.oauthbearer.scope sasl.oauthbearer.sub.claim.name
    sasl.oauthbearer.token.endpoint.url sasl.password sasl.username security.protocol
    socket.connection.setup.timeout.ms socket.keepalive.enable socket.max.fails
    socket.nagle.disable socket.receive.buffer.bytes socket.send.buffer.bytes
    socket.timeout.ms ssl.ca.certificate.stores ssl.ca.location ssl.ca.pem
    ssl.certificate.location ssl.certificate.pem ssl.cipher.suites ssl.crl.location
    ssl.curves.list ssl.endpoint.identification.algorithm ssl.engine.id ssl.key.location
    ssl.key.password ssl.key.pem ssl.keystore.location ssl.keystore.password ssl.providers
    ssl.sigalgs.list statistics.interval.ms topic.blacklist topic.metadata.propagation.max.ms
    topic.metadata.refresh.fast.interval.ms topic.metadata.refresh.interval.ms
    topic.metadata.refresh.sparse
    """.split()
)
"""Properties of every librdkafka client (``*`` in CONFIGURATION.md)."""
PRODUCER = COMMON | frozenset(
    """
    acks batch.num.messages batch.size compression.codec compression.level compression.type
    delivery.report.only.error delivery.timeout.ms enable.gapless.guarantee enable.idempotence
    linger.ms message.send.max.retries message.timeout.ms partitioner
    queue.buffering.backpressure.threshold queue.buffering.max.kbytes
    queue.buffering.max.messages queue.buffering.max.ms request.required.acks
    request.timeout.ms retries sticky.partitioning.linger.ms transaction.timeout.ms
    transactional.id
    """.split()
)
"""Properties a producer takes."""
CONSUMER = COMMON | frozenset(
    """
    auto.commit.interval.ms auto.offset.reset check.crcs consume.callback.max.messages
    coordinator.query.interval.ms enable.auto.commit enable.auto.offset.store
    enable.partition.eof fetch.error.backoff.ms fetch.max.bytes fetch.message.max.bytes
    fetch.min.bytes fetch.queue.backoff.ms fetch.wait.max.ms group.id group.instance.id
    group.protocol group.protocol.type group.remote.assignor heartbeat.interval.ms
    isolation.level max.partition.fetch.bytes max.poll.interval.ms max.poll.records
    partition.assignment.strategy queued.max.messages.kbytes queued.min.messages
    session.timeout.ms share.acknowledgement.mode
    """.split()
)
"""Properties a consumer takes."""
ALIASES = {
    "bootstrap.servers": "metadata.broker.list",
    "max.in.flight": "max.in.flight.requests.per.connection",
    "max.partition.fetch.bytes": "fetch.message.max.bytes",
    "linger.ms": "queue.buffering.max.ms",
    "retries": "message.send.max.retries",
    "compression.type": "compression.codec",
    "acks": "request.required.acks",
    "delivery.timeout.ms": "message.timeout.ms",
    "enable.auto.commit": "auto.commit.enable",
    "sasl.mechanism": "sasl.mechanisms",
}
"""librdkafka's aliases: alias -> the property it sets."""


def _canonical(key: str) -> str:
    return ALIASES.get(key, key)


def _security(key: str) -> bool:
    return key == "security.protocol" or key.startswith(("ssl.", "sasl.", "ssl_"))


def client_config(
    given: Mapping[str, Value],
    *,
    defaults: Mapping[str, Value],
    client: Literal["producer", "consumer"],
    owned: Mapping[str, str],
) -> dict[str, Value]:
    """``defaults``, then ``given`` over them: the properties a client is built with.

    ``client`` says which properties are known (:data:`PRODUCER` or :data:`CONSUMER`); ``owned``
    maps each property the component sets itself to the setting to use instead (or why it is
    fixed). The errors name the key, not the setting (pydantic's error says where)."""
    known = PRODUCER if client == "producer" else CONSUMER
    owned_canonical = {_canonical(k): why for k, why in owned.items()}
    merged = dict(defaults)
    for key, value in given.items():
        if _security(key):
            raise ValueError(
                f"{key!r} is set from the SHADOW_AB_KAFKA_* variables (TLS and SASL,"
                " the same for every client; shadow_ab/kafka_security.py), not here"
            )
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f"{key!r} is not a librdkafka {client} property{hint}"
                " (the properties: librdkafka's CONFIGURATION.md)"
            )
        why = owned_canonical.get(_canonical(key))
        if why is not None:
            raise ValueError(f"{key!r} cannot be set here: {why}")
        for other in [k for k in merged if _canonical(k) == _canonical(key)]:
            del merged[other]  # a default given under another name of the same property
        merged[key] = value
    return merged


def lookup(props: Mapping[str, Value], key: str) -> Value | None:
    """The value of property ``key`` in ``props``, under its own name or an alias; None when
    absent."""
    for name, value in props.items():
        if _canonical(name) == _canonical(key):
            return value
    return None
