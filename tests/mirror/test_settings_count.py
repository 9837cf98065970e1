"""Issue 26, "Fewer choices": the mirror's leaf settings stay few, and a removed setting is
refused with what replaced it."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from mirror.config import REMOVED, MirrorConfigError, MirrorSettings, load_settings

LEAVES_NOW = 60
"""The count today: it may fall, never rise (lower it as settings go)."""
LEAVES_GOAL = 60


def leaves(model: type[BaseModel], prefix: str = "") -> list[str]:
    """The dotted names of the settings one can set (nested models' fields, not the models)."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        args = typing.get_args(field.annotation) or (field.annotation,)
        sub = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        out += leaves(sub[0], f"{prefix}{name}.") if sub else [prefix + name]
    return out


def test_the_settings_do_not_grow() -> None:
    names = leaves(MirrorSettings)
    assert len(names) <= LEAVES_NOW, "\n".join(names)


def test_at_most_60_settings() -> None:
    names = leaves(MirrorSettings)
    assert len(names) <= LEAVES_GOAL, "\n".join(names)


def test_no_removed_setting_is_still_a_setting() -> None:
    assert not set(REMOVED) & set(leaves(MirrorSettings))


@pytest.mark.parametrize(
    ("yaml", "name", "says"),
    [
        ("guard: {window_s: 30}", "guard.window_s", "mirror/guard.py"),
        ("shadow: {replay_pool: shared}", "shadow.replay_pool", "own pool"),
        (
            "candidate: {url: 'http://c:1', connect_timeout_s: 3}",
            "candidate.connect_timeout_s",
            "CONNECT_TIMEOUT_S",
        ),
        ("kafka: {bootstrap: 'k:9092', queue_max: 5}", "kafka.queue_max", "mirror/kafka_sink.py"),
        ("sink_close_timeout_s: 10", "sink_close_timeout_s", "SINK_CLOSE_TIMEOUT_S"),
        ("kafka_bootstrap: 'k:9092'", "kafka_bootstrap", "kafka.bootstrap"),
        ("reuse_port: true", "reuse_port", "workers"),
        ("admin_host: 0.0.0.0", "admin_host", "host"),
        ("privacy: {hash_key: k}", "privacy.hash_key", "hash_key_file"),
        ("candidate: {url: 'http://c:1', headers_env: {a: B}}", "candidate.headers_env", "{env:"),
        ("candidate: {url: 'http://c:1', rewrite: {model: m}}", "candidate.rewrite.model", '"*"'),
        (
            "incumbent: {url: 'http://i:1', keepalive_timeout_s: 3}",
            "incumbent.keepalive_timeout_s",
            "KEEPALIVE_S",
        ),
    ],
)
def test_a_removed_setting_is_refused_with_what_replaced_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml: str, name: str, says: str
) -> None:
    for var in ("SHADOW_AB_DATABASE_URL", "SHADOW_AB_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)
    cfg = tmp_path / "mirror.yaml"
    cfg.write_text(f"incumbent: {{url: 'http://i:1'}}\ncandidate: {{url: 'http://c:1'}}\n{yaml}\n")
    with pytest.raises(MirrorConfigError) as caught:
        load_settings(cfg)
    message = str(caught.value)
    assert f"{name}: removed setting: " in message and says in message and "issue 26" in message
    assert "unknown setting" not in message
