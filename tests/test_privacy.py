"""The shared privacy helpers (shadow_ab/privacy.py) and the Kafka clients' security settings
(shadow_ab/kafka_security.py): plain values, no services."""

from __future__ import annotations

import itertools
import logging
import random
from pathlib import Path
from typing import Any

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
    redact_tokens,
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
        # a password holding "@": masked up to the last "@" before the host
        ("http://user:p@ss@host", "http://user:***@host"),
        ("http://user:p@s@s:x@host:8000/v1", "http://user:***@host:8000/v1"),
        # "@" after the host (path, query) is not user info
        ("http://user:p@ss@host/u/a@b?to=c@d", "http://user:***@host/u/a@b?to=c@d"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_redact_urls_passwords_with_at_signs_in_quotes_and_lists() -> None:
    text = (
        "InvalidURL('http://u:pa@ss@h1:9*'), \"https://v:c@d@h2?q=1\" and"
        " <postgresql://w:e@f@db/app>, http://h3:80/p@q, http://x@h4/a@b, mail@example.com"
    )
    assert redact_urls(text) == (
        "InvalidURL('http://u:***@h1:9*'), \"https://v:***@h2?q=1\" and"
        " <postgresql://w:***@db/app>, http://h3:80/p@q, http://x@h4/a@b, mail@example.com"
    )


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


def nested(depth: int, bottom: dict[str, Any]) -> dict[str, Any]:
    """``bottom`` under ``depth`` levels of alternating objects and arrays."""
    value: Any = bottom
    for i in range(depth // 2):
        value = {"x": [value], "n": i}
    return value  # type: ignore[no-any-return]


@pytest.mark.parametrize("depth", [990, 5000])
def test_strip_credentials_at_any_depth_without_recursion(depth: int) -> None:
    # issue 26: a body nested 990 deep made the recursive version raise RecursionError (the
    # client got a 500 and the incumbent never saw the request)
    body = nested(depth, {"api_key": "sk-deep", "keep": "me"})
    out, removed = strip_credentials(body)
    assert removed == [".".join(["x[0]"] * (depth // 2)) + ".api_key"]
    inner = out
    for _ in range(depth // 2):
        inner = inner["x"][0]
    assert inner == {"keep": "me"}
    assert strip_credentials(nested(depth, {"keep": "me"}))[1] == []


def test_strip_credentials_in_document_order_and_shares_what_it_keeps() -> None:
    tokens = list(range(100_000))
    body = {"a": {"password": 1}, "api_key": 2, "prompt": tokens, "b": [[{"Cookie": 3}], 4]}
    out, removed = strip_credentials(body)
    assert removed == ["a.password", "api_key", "b[0][0].Cookie"]
    assert out == {"a": {}, "prompt": tokens, "b": [[{}], 4]}
    assert out["prompt"] is tokens  # not copied
    assert body["b"] == [[{"Cookie": 3}], 4]  # input untouched
    top, top_removed = strip_credentials([{"secret": 1}, 2])
    assert top == [{}, 2] and top_removed == ["[0].secret"]


def test_redact_strings_at_any_depth_without_recursion() -> None:
    value = nested(5000, {"mail": "write to a@b.example", "n": 1})
    out = redact_strings(value, redact_text)
    for _ in range(2500):
        assert out["x"] is not value["x"]  # a new object for every object and array
        out, value = out["x"][0], value["x"][0]
    assert out == {"mail": "write to [EMAIL]", "n": 1}


def test_redact_strings_copies_arrays_of_scalars_and_reaches_strings_among_them() -> None:
    tokens = list(range(1000))
    value = {"prompt": tokens, "mixed": [1, "a@b.example", [2, "c@d.example"]]}
    out = redact_strings(value, redact_text)
    assert out == {"prompt": tokens, "mixed": [1, "[EMAIL]", [2, "[EMAIL]"]]}
    assert out["prompt"] is not tokens
    assert redact_strings([3, 4], redact_text) == [3, 4]


# -- the built-in redactor -------------------------------------------------------------------------


def fw(text: str) -> str:
    """``text`` in full-width forms (a space stays a space)."""
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)


def arabic(text: str) -> str:
    """``text`` with Arabic-Indic digits."""
    return text.translate({48 + i: 0x660 + i for i in range(10)})


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
        # Unicode local parts and domains (IDN)
        ("write to josé@example.com", "write to [EMAIL]"),
        ("écrire à élodie.dupont@example.com.", "écrire à [EMAIL]."),
        ("mail: jürgen@bücher.example, or", "mail: [EMAIL], or"),
        ("почта: иван@пример.рф", "почта: [EMAIL]"),
        ("नमस्ते राम@उदाहरण.भारत", "नमस्ते [EMAIL]"),
        ("an IDN in ASCII: a@xn--bcher-kva.xn--p1ai", "an IDN in ASCII: [EMAIL]"),
        (fw("jose@example.com") + " and", "[EMAIL] and"),
        # bare ten-digit North American numbers, eleven with a 1 (or a Chinese mobile), E.164
        ("call 5551234567 now", "call [PHONE] now"),
        ("call 14155552671 or +14155552671", "call [PHONE] or [PHONE]"),
        ("电话13812345678\uff0c谢谢", "电话[PHONE]\uff0c谢谢"),
        # ... but not Unix times, zero-led or other lengths of digits, decimals
        (
            "at 1767225600 (epoch), id 0123456789, n 123456789012: call 5551234567",
            "at 1767225600 (epoch), id 0123456789, n 123456789012: call [PHONE]",
        ),
        ("e=2.7182818284, x=0.5551234567, 2025550143", "e=2.7182818284, x=0.5551234567, [PHONE]"),
        # cards with dots (Luhn-checked); a number with one dot is a decimal
        ("card 4111.1111.1111.1111 exp", "card [CARD] exp"),
        (
            "4111.1111.1111.1112 (fails Luhn), pi 3.141592653589793, 4.111111111111111,"
            " 5500.0000.0000.0004",
            "4111.1111.1111.1112 (fails Luhn), pi 3.141592653589793, 4.111111111111111, [CARD]",
        ),
        # full-width and other Unicode decimal digits; the rest of the text kept as it was
        (f"カード {fw('4111 1111 1111 1111')} です", "カード [CARD] です"),
        (f"電話{fw('555-123-4567')}まで", "電話[PHONE]まで"),
        (fw("tel 5551234567 ok"), f"{fw('tel')} [PHONE] {fw('ok')}"),
        (f"رقم {arabic('555-123-4567')} هنا", "رقم [PHONE] هنا"),
        (
            f"{fw('4111-1111-1111-1112')} ok, {fw('2026')}年{fw('1')}月,"
            f" {fw('4111-1111-1111-1111')}",
            f"{fw('4111-1111-1111-1112')} ok, {fw('2026')}年{fw('1')}月, [CARD]",
        ),
    ],
)
def test_builtin_redactor(text: str, expected: str | None) -> None:
    assert redact_text(text) == (text if expected is None else expected)


def test_luhn() -> None:
    assert luhn_ok("4111111111111111") and luhn_ok("79927398713")
    assert not luhn_ok("4111111111111112")


def test_redact_strings_reaches_nested_values_and_keys() -> None:
    value = {
        "user": "a@b.example",
        "meta": {"emails": ["c@d.example", 3], "alice@example.com": {"bob@example.org": "x"}},
        "a@b.example": 1,
    }
    out = redact_strings(value, redact_text)
    assert out == {
        "user": "[EMAIL]",
        "meta": {"emails": ["[EMAIL]", 3], "[EMAIL]": {"[EMAIL]": "x"}},
        "[EMAIL]": 1,
    }
    # keys that become one keep every value: the later ones numbered, in order, past any
    # key the object already had
    many = {"a@b.example": 1, "[EMAIL] (2)": 2, "c@d.example": 3, "e@f.example": 4}
    assert redact_strings(many, redact_text) == {
        "[EMAIL]": 1,
        "[EMAIL] (2)": 2,
        "[EMAIL] (3)": 3,
        "[EMAIL] (4)": 4,
    }
    assert redact_strings(value, lambda s: s) == value


@pytest.mark.parametrize("spec", ["builtin", "privacy_redactors:mark"])
def test_redact_tokens_join_to_the_redacted_text_however_split(spec: str) -> None:
    redactor = load_redactor(spec)
    texts = [
        "Mail alice.smith@example.com or call 415-555-2671, card 4111 1111 1111 1111 in Paris.",
        "key sk-proj-abcdefghijklmnopqrstuvwx and Bearer abcdefghijkl; josé@exämple.com",
        "Nothing to hide here, 42 times.",
    ]
    rnd = random.Random(7)
    for text in texts:
        redacted = redactor(text)
        for _ in range(200):
            cuts = sorted(rnd.sample(range(len(text) + 1), rnd.randint(0, 12)))
            cuts = [0, *cuts, len(text)]
            tokens = [text[a:b] for a, b in itertools.pairwise(cuts)]  # some empty
            out, changed = redact_tokens(tokens, redactor)
            assert "".join(out) == redacted and len(out) == len(tokens)
            assert all(c for t, o, c in zip(tokens, out, changed, strict=True) if t != o)
            for secret in ("alice", "555", "4111", "sk-proj", "abcdefghijkl", "josé", "Paris"):
                if secret not in redacted:
                    assert secret not in "".join(o for o, c in zip(out, changed, strict=True) if c)


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
