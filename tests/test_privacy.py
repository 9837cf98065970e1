"""The shared privacy helpers (shadow_ab/privacy.py) and the Kafka clients' security settings
(shadow_ab/kafka_security.py): plain values, no services."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shadow_ab.kafka_security import kafka_security
from shadow_ab.privacy import (
    Digester,
    error_summary,
    install_log_redaction,
    is_digest,
    load_redactor,
    luhn_ok,
    redact_strings,
    redact_text,
    redact_url,
    redact_urls,
    strip_credentials,
)

# -- URLs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://user:PASSWORD@10.0.0.5:8000", "http://user:***@10.0.0.5:8000"),
        ("https://:tok3n@engine.example/v1", "https://:***@engine.example/v1"),
        (
            "postgresql+psycopg://shadow:pg-Secret@db:5432/app",
            "postgresql+psycopg://shadow:***@db:5432/app",
        ),
        ("http://user@10.0.0.5:8000", "http://user@10.0.0.5:8000"),
        ("http://10.0.0.5:8000/v1", "http://10.0.0.5:8000/v1"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_urls_inside_any_text() -> None:
    # what aiohttp said for `OPTIONS *` (issue 14): the whole URL, password included
    text = "InvalidURL('http://user:PASSWORD@127.0.0.1:9*') and http://a:b@h/x, mail@example.com"
    out = redact_urls(text)
    assert "PASSWORD" not in out and ":b@" not in out
    assert "http://user:***@127.0.0.1:9*" in out and "mail@example.com" in out


def test_every_log_line_is_redacted(caplog: pytest.LogCaptureFixture) -> None:
    install_log_redaction()
    install_log_redaction()  # idempotent
    log = logging.getLogger("test.privacy")
    with caplog.at_level(logging.INFO, logger="test.privacy"):
        log.info("mirroring %s", "http://u:SECRET1@inc:8000")
        try:
            raise ValueError("cannot reach http://u:SECRET2@cand:8001")
        except ValueError:
            log.exception("failed")
    text = caplog.text
    assert "SECRET1" not in text and "SECRET2" not in text
    assert "http://u:***@inc:8000" in text and "http://u:***@cand:8001" in text


# -- credentials in JSON ---------------------------------------------------------------------------


def test_strip_credentials_at_any_depth() -> None:
    body = {
        "model": "m",
        "API_KEY": "sk-top",
        "metadata": {"api_key": "sk-nested", "user": "alice", "auth": {"Password": "pw"}},
        "tools": [{"function": {"name": "f", "client_secret": "cs"}}],
        "messages": [{"role": "user", "content": "my api_key is in the text, not a key"}],
    }
    out, removed = strip_credentials(body)
    assert removed == [
        "API_KEY",
        "metadata.api_key",
        "metadata.auth.Password",
        "tools[0].function.client_secret",
    ]
    assert out == {
        "model": "m",
        "metadata": {"user": "alice", "auth": {}},
        "tools": [{"function": {"name": "f"}}],
        "messages": body["messages"],
    }
    assert body["metadata"]["api_key"] == "sk-nested"  # input untouched
    same, none = strip_credentials({"a": [1, {"b": 2}]})
    assert none == [] and same == {"a": [1, {"b": 2}]}


# -- the built-in redactor -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("write to jane.doe+x@mail.example.co.uk today", "write to [EMAIL] today"),
        ("call +44 20 7946 0958 now", "call [PHONE] now"),
        ("call (415) 555-2671 or 415-555-2671", "call [PHONE] or [PHONE]"),
        ("card 4111 1111 1111 1111 exp", "card [CARD] exp"),
        ("card 4111-1111-1111-1112 is not a valid number", None),  # fails Luhn: kept
        ("key sk-proj-abcdefghijklmnopqrstuvwx end", "key [API_KEY] end"),
        ("AKIAIOSFODNN7EXAMPLE", "[API_KEY]"),
        ("Authorization: Bearer eyJhbGciOi.abc123", "Authorization: Bearer [TOKEN]"),
        ("token eyJhbGciOiJIUzI1.eyJzdWIiOiIxMjM0.SflKxwRJSMeKKF2QT4", "token [API_KEY]"),
        ("the answer is 42, in 2026 at 10:30", None),
        ("order 12345678 shipped", None),
    ],
)
def test_builtin_redactor(text: str, expected: str | None) -> None:
    assert redact_text(text) == (text if expected is None else expected)


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("79927398713")
    assert not luhn_ok("4111111111111112")


def test_redact_strings_reaches_nested_values_not_keys() -> None:
    value = {"user": "a@b.example", "meta": {"emails": ["c@d.example", 3]}, "a@b.example": 1}
    out = redact_strings(value, redact_text)
    assert out == {"user": "[EMAIL]", "meta": {"emails": ["[EMAIL]", 3]}, "a@b.example": 1}


def test_load_redactor() -> None:
    assert load_redactor("builtin") is redact_text
    assert load_redactor("none")("a@b.example") == "a@b.example"
    assert load_redactor("privacy_redactors:upper")("abc") == "ABC"
    for bad, says in [
        ("nope", "module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        ("privacy_redactors:missing", "has no"),
        ("privacy_redactors:NOT_CALLABLE", "not callable"),
        ("privacy_redactors:returns_none", "must return a string"),
    ]:
        with pytest.raises(ValueError, match=says):
            load_redactor(bad)


# -- digests and error bodies ---------------------------------------------------------------------


def test_digests_are_keyed_and_compare_equal_texts() -> None:
    a, b = Digester(b"k1"), Digester(b"k1")
    assert a.text("yes") == b.text("yes") != a.text("no")
    assert is_digest(a.text("yes")) and not is_digest("yes")
    assert Digester(b"k2").text("yes") != a.text("yes")  # unreadable without the key
    assert Digester().text("yes") != Digester().text("yes")  # random key per process
    assert a.token("Hello") == b.token("Hello") and a.token("Hello") != a.token("hello")
    assert a.value([{"role": "user", "content": "x"}]) == b.value(
        [{"content": "x", "role": "user"}]
    )


def test_error_summary_keeps_no_message() -> None:
    body = (
        '{"object":"error","message":"prompt \'my secret diagnosis\' is too long",'
        '"type":"BadRequestError","param":null,"code":400}'
    )
    out = error_summary(body, "capture metadata")
    assert "diagnosis" not in out
    assert out.startswith("type=BadRequestError code=400 [message not kept: capture metadata;")
    assert "secret" not in error_summary("plain text echo of the secret prompt")


# -- Kafka security ------------------------------------------------------------------------------


def test_kafka_security_from_the_environment(tmp_path: Path) -> None:
    assert kafka_security({}) == {}
    ca = tmp_path / "ca.crt"
    ca.write_text("---")
    password = tmp_path / "password"
    password.write_text("s3cret\n")
    env = {
        "SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "sasl_ssl",
        "SHADOW_AB_KAFKA_SASL_USERNAME": "shadow-ab-mirror",
        "SHADOW_AB_KAFKA_SASL_PASSWORD_FILE": str(password),
        "SHADOW_AB_KAFKA_SSL_CAFILE": str(ca),
    }
    assert kafka_security(env) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "shadow-ab-mirror",
        "sasl_plain_password": "s3cret",
        "ssl_cafile": str(ca),
        "ssl_check_hostname": True,
    }
    with pytest.raises(ValueError, match="SASL_USERNAME and"):
        kafka_security({"SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(ValueError, match="not one of"):
        kafka_security({"SHADOW_AB_KAFKA_SECURITY_PROTOCOL": "TLS"})
    with pytest.raises(ValueError, match="cannot read"):
        kafka_security({**env, "SHADOW_AB_KAFKA_SSL_CAFILE": str(tmp_path / "missing.crt")})
    with pytest.raises(ValueError, match="both"):
        kafka_security({**env, "SHADOW_AB_KAFKA_SSL_CERTFILE": str(ca)})
