"""Mirror settings: YAML, then environment, then flags; errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from mirror.cli import mirror
from mirror.config import MirrorConfigError, MirrorSettings, load_settings


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("SHADOW_AB_DATABASE_URL", "SHADOW_AB_KAFKA_BOOTSTRAP"):
        monkeypatch.delenv(var, raising=False)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "mirror.yaml"
    path.write_text(text)
    return path


def test_yaml_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = write(
        tmp_path,
        """
incumbent: {url: "http://inc:8000/v1/"}
candidate:
  url: http://cand:8000
  rewrite: {model_map: {'*': trt-model}, drop_fields: [top_k]}
shadow: {rate: 0.25, header: X-Session-Id, replay_rate: 0.05}
guard: {bound: 0.5}
deployment: from-yaml
port: 9000
""",
    )
    s = load_settings(cfg)
    assert s.incumbent.url == "http://inc:8000"  # the OpenAI base URL is accepted
    assert s.candidate.rewrite.model_map == {"*": "trt-model"}
    assert (s.shadow.rate, s.shadow.header, s.shadow.replay_rate) == (0.25, "x-session-id", 0.05)
    assert s.guard.bound == 0.5 and s.port == 9000
    assert s.incumbent_engine() == "vllm@incumbent" and s.candidate_engine() == "trtllm@candidate"
    # the health sampler recognises both engines' /metrics; the ids stay what they were
    assert (s.incumbent.flavor, s.candidate.flavor) == ("auto", "auto")
    assert s.kafka is None and s.database_url.startswith("sqlite:///")

    monkeypatch.setenv("SHADOW_AB_MIRROR_SHADOW__RATE", "0.5")
    monkeypatch.setenv("SHADOW_AB_MIRROR_DEPLOYMENT", "from-env")
    monkeypatch.setenv("SHADOW_AB_KAFKA_BOOTSTRAP", "127.0.0.1:59092")
    s = load_settings(cfg)
    assert s.shadow.rate == 0.5 and s.shadow.header == "x-session-id"  # deep-merged
    assert s.deployment == "from-env"
    assert s.kafka is not None and s.kafka.bootstrap == "127.0.0.1:59092"

    # a kafka: section in YAML keeps its settings; the flag's bootstrap wins
    cfg.write_text(cfg.read_text() + "kafka: {bootstrap: yaml-host:9092, spool_max_bytes: 7777}\n")
    s = load_settings(cfg, kafka_bootstrap="flag-host:9092")
    assert s.kafka is not None
    assert (s.kafka.bootstrap, s.kafka.spool_max_bytes) == ("flag-host:9092", 7777)

    s = load_settings(cfg)  # SHADOW_AB_KAFKA_BOOTSTRAP beats the YAML's
    assert s.kafka is not None
    assert (s.kafka.bootstrap, s.kafka.spool_max_bytes) == ("127.0.0.1:59092", 7777)
    monkeypatch.delenv("SHADOW_AB_KAFKA_BOOTSTRAP")
    s = load_settings(cfg)
    assert s.kafka is not None and s.kafka.bootstrap == "yaml-host:9092"
    with pytest.raises(MirrorConfigError, match="--kafka: Kafka bootstrap 'nope' must be HOST"):
        load_settings(cfg, kafka_bootstrap="nope")
    monkeypatch.setenv("SHADOW_AB_MIRROR_KAFKA_BOOTSTRAP", "old:9092")
    with pytest.raises(MirrorConfigError, match=r"removed setting: give kafka\.bootstrap"):
        load_settings(cfg)
    monkeypatch.delenv("SHADOW_AB_MIRROR_KAFKA_BOOTSTRAP")

    s = load_settings(cfg, deployment="from-flag", shadow={"rate": 0.75}, port=9100)
    assert (s.deployment, s.shadow.rate, s.port) == ("from-flag", 0.75, 9100)
    assert s.shadow.replay_rate == 0.05


def test_missing_urls_say_which_flag(tmp_path: Path) -> None:
    with pytest.raises(MirrorConfigError) as info:
        load_settings(None)
    msg = str(info.value)
    assert "incumbent: required: give --incumbent URL" in msg
    assert "candidate: required: give --candidate URL" in msg


@pytest.mark.parametrize(
    ("yaml_text", "expected"),
    [
        ("incumbent: {url: ftp://x}\ncandidate: {url: http://c}", "incumbent.url"),
        ("incumbent: {url: http://a}\ncandidate: {url: http://a}", "same server"),
        (
            "incumbent: {url: http://a}\ncandidate: {url: http://c}\nshadow: {rate: 2}",
            "shadow.rate",
        ),
        ("incumbent: {url: http://a}\ncandidate: {url: http://c}\nsampling: 1", "unknown setting"),
        (
            "incumbent: {url: http://a}\ncandidate: {url: http://c}\ndatabase_url: mysql://x",
            "not supported",
        ),
        ("- a list", "mapping of settings"),
        ("incumbent: [", "not YAML"),
    ],
)
def test_bad_settings_are_explained(tmp_path: Path, yaml_text: str, expected: str) -> None:
    with pytest.raises(MirrorConfigError, match=expected):
        load_settings(write(tmp_path, yaml_text))


def test_cli_reports_bad_settings_as_a_usage_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(mirror, ["--incumbent", "http://a:1", "--shadow-rate", "3"])
    assert result.exit_code == 2
    assert "shadow.rate" in result.output and "candidate" in result.output
    missing = CliRunner().invoke(mirror, ["--config", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 2 and "cannot read the config file" in missing.output


@pytest.mark.parametrize(
    ("inc", "cand", "ids"),
    [
        ({}, {}, ("vllm@incumbent", "trtllm@candidate")),
        ({"flavor": "trtllm"}, {"flavor": "vllm"}, ("trtllm@incumbent", "vllm@candidate")),
        ({"flavor": "auto"}, {"flavor": "auto"}, ("engine@incumbent", "engine@candidate")),
        ({"engine": "a"}, {"flavor": "vllm", "engine": "b"}, ("a", "b")),
    ],
)
def test_engine_ids_follow_a_set_flavor_and_stay_when_none_is_set(
    inc: dict[str, str], cand: dict[str, str], ids: tuple[str, str]
) -> None:
    s = MirrorSettings(
        incumbent={"url": "http://inc:8000", **inc}, candidate={"url": "http://cand:8000", **cand}
    )
    assert (s.incumbent_engine(), s.candidate_engine()) == ids


def test_the_mirrors_errors_are_one_tree() -> None:
    """Every public exception class of the mirror's modules is under MirrorError
    (mirror/errors.py), but for the few its parts raise and catch among themselves, which the
    errors module names as never leaving the mirror."""
    import importlib
    import inspect
    import pkgutil

    import mirror
    from mirror.errors import MirrorError

    internal = {"AnswerTruncated", "MessageSizeTooLargeError", "BatchRefusedError", "DeliveryError"}
    outside = []
    for info in pkgutil.iter_modules(mirror.__path__):
        module = importlib.import_module(f"mirror.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__ or name.startswith("_"):
                continue
            if issubclass(cls, BaseException) and not issubclass(cls, MirrorError):
                outside.append(name)
    assert sorted(outside) == sorted(internal)
    doc = importlib.import_module("mirror.errors").__doc__ or ""
    assert all(name in doc for name in ("AnswerTruncated", "ListenError", "RedactionError"))
