"""Records through the direct sink into PostgreSQL, and SIGTERM: in-flight answers finish,
shadow requests drain, the sink flushes, the process exits 0."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx
from mirror_helpers import MODEL, post, rows
from sqlalchemy import text

from shadow_ab.dev.processes import RunningSim, http_get, running_mirror
from storage.db import make_engine


def test_postgresql_records_and_sigterm_drain(
    engines: tuple[RunningSim, RunningSim], pg_url: str
) -> None:
    inc, cand = engines
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "drain me"}],
        "max_tokens": 300,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }
    answer: dict[str, Any] = {}
    with running_mirror(
        inc.base_url,
        cand.base_url,
        database_url=pg_url,
        deployment="pg-test",
        shadow={"replay_rate": 1.0},
        health={"interval_s": 0.2},
    ) as mirror:

        def ask() -> None:
            with httpx.Client(timeout=30.0) as client:
                answer["result"] = post(client, mirror.base_url + "/v1/chat/completions", body)

        thread = threading.Thread(target=ask)
        thread.start()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b'"incumbent":1' not in _healthz(mirror.admin_url):
            time.sleep(0.01)
        code = mirror.stop()  # SIGTERM while the answer streams
        thread.join(30)
    assert code == 0, mirror.stderr()
    status, headers, raw, _ = answer["result"]
    assert status == 200 and raw.endswith(b"data: [DONE]\n\n")
    assert raw.count(b'"content":') == 301  # the role delta + 300 tokens: nothing cut short

    found = {r["role"]: r for r in rows(pg_url, "pair_id = :p", p=headers["x-shadow-pair-id"])}
    assert set(found) == {"incumbent", "candidate", "replay"}
    for role, r in found.items():
        assert r["status"] == "ok", role
        assert r["completion_tokens"] == 300 and len(r["itl_s"]) >= 1
        assert 0 < r["ttft_s"] < r["e2e_s"] and r["tpot_s"] > 0
        assert r["deployment"] == "pg-test"
    assert found["replay"]["engine"] == found["incumbent"]["engine"] == "vllm@incumbent"
    assert found["replay"]["output_text"] == found["incumbent"]["output_text"]
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            sampled = conn.execute(
                text("SELECT DISTINCT engine FROM health_samples WHERE deployment = 'pg-test'")
            ).scalars()
            assert set(sampled) == {"vllm@incumbent", "trtllm@candidate"}
    finally:
        engine.dispose()


def _healthz(base_url: str) -> bytes:
    return http_get(base_url + "/healthz")[1].replace(b" ", b"")


def test_health_only_samples_both_engines_and_serves_metrics(
    engines: tuple[RunningSim, RunningSim], tmp_path: Path
) -> None:
    db = f"sqlite:///{tmp_path / 'health.db'}"
    with running_mirror(
        engines[0].base_url,
        engines[1].base_url,
        database_url=db,
        deployment="health-test",
        health_only=True,
        health={"interval_s": 0.2},
    ) as sampler:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if sampler.metric("shadow_ab_engine_up", engine="trtllm@candidate") == 1.0:
                break
            time.sleep(0.1)
        assert sampler.metric("shadow_ab_engine_up", engine="vllm@incumbent") == 1.0
        assert sampler.metric("shadow_ab_engine_up", engine="trtllm@candidate") == 1.0
        assert http_get(sampler.base_url + "/v1/models")[0] == 404  # no serving path here
        assert sampler.stop() == 0
    engine = make_engine(db)
    try:
        with engine.connect() as conn:
            found = conn.execute(
                text("SELECT engine, count(*) FROM health_samples GROUP BY engine")
            ).all()
    finally:
        engine.dispose()
    assert {e for e, n in found if n >= 1} == {"vllm@incumbent", "trtllm@candidate"}
