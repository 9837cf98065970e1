"""Wire details of the vLLM flavor, each pinned to the vLLM source it was checked against
(vLLM 0.11's ``vllm/entrypoints/openai/serving_chat.py``, ``serving_completion.py``,
``protocol.py``, ``vllm/v1/engine/logprobs.py``, ``vllm/v1/metrics/loggers.py``, moved to what
vLLM 0.32.0 answers: ``tests/fixtures/vllm-0.32.0/``, recorded from the real server, and
``test_sim_fixtures.py``), plus TensorRT-LLM's optional ``/prometheus/metrics``
(``tensorrt_llm/serve/openai_server.py``, ``tensorrt_llm/metrics/collector.py``)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from sim_helpers import FAST

from shadow_ab.dev.processes import RunningSim, http_get, running_sim
from simulator.metrics import build_1_2_5_buckets
from simulator.wire import chat_prompt, completion_prompts

MODEL = "sim-llama-3-8b-instruct"
MESSAGES = [{"role": "user", "content": "Where is New York?"}]
USAGE_KEYS = {"prompt_tokens", "total_tokens", "completion_tokens"}
CHAT_STREAM_USAGE_KEYS = USAGE_KEYS | {"completion_tokens_details"}  # 0.32, null


def post(sim: RunningSim, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        sim.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read()


def events(body: bytes) -> list[dict[str, Any]]:
    """The JSON events of an SSE body; asserts the vLLM framing and the final [DONE]."""
    parts = body.split(b"\n\n")
    assert parts[-1] == b"" and parts[-2] == b"data: [DONE]"
    out = []
    for p in parts[:-2]:
        assert p.startswith(b"data: ") and not p.endswith(b" ")
        out.append(json.loads(p.removeprefix(b"data: ")))
    return out


@pytest.fixture(scope="module")
def vllm() -> Iterator[RunningSim]:
    with running_sim("vllm", "clean", overrides=FAST) as s:
        yield s


def test_chat_stream_chunk_shapes(vllm: RunningSim) -> None:
    """serving_chat.py chat_completion_stream_generator: the role chunk per choice is
    ``DeltaMessage(role=role, content="")`` with ``logprobs=None, finish_reason=None`` (0.32:
    and ``prompt_token_ids``/``prompt_text`` null); chunks are dumped with ``exclude_unset=True``
    (``stop_reason`` set only on a choice's finishing chunk, 0.32: ``token_ids`` null on each;
    continuous usage ``prompt_tokens, total_tokens, completion_tokens`` and, 0.32,
    ``completion_tokens_details`` null, counting ``previous_num_tokens[i]`` of that choice); the
    final usage chunk (``choices: []``) is dumped with ``exclude_none=True``."""
    status, body = post(
        vllm,
        "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": MESSAGES,
            "n": 2,
            "max_tokens": 9,
            "temperature": 0.7,
            "seed": 5,
            "logprobs": True,  # top_logprobs 0: lets the test count the tokens of each chunk
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert status == 200
    evs = events(body)
    n_prompt = chat_prompt(MESSAGES)[1]
    roles = [e for e in evs if e["choices"] and "role" in e["choices"][0]["delta"]]
    assert sorted(e["choices"][0]["index"] for e in roles) == [0, 1]
    for e in roles:
        assert list(e) == ["id", "object", "created", "model", "choices", "usage",
                           "prompt_token_ids", "prompt_text"]  # fmt: skip
        assert e["object"] == "chat.completion.chunk"
        assert e["choices"][0] == {
            "index": e["choices"][0]["index"],
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        assert e["usage"] == {"prompt_tokens": n_prompt, "total_tokens": n_prompt,
                              "completion_tokens": 0,
                              "completion_tokens_details": None}  # fmt: skip
    counted = {0: 0, 1: 0}
    finished = set()
    for e in evs[len(roles) : -1]:
        (ch,) = e["choices"]
        i = ch["index"]
        counted[i] += len(ch["logprobs"]["content"])
        assert set(e["usage"]) == CHAT_STREAM_USAGE_KEYS
        assert e["usage"]["completion_tokens"] == counted[i]  # this choice only
        assert e["usage"]["prompt_tokens"] == n_prompt
        if ch["finish_reason"] is None:
            assert list(ch) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
        else:
            assert list(ch) == ["index", "delta", "logprobs", "finish_reason", "stop_reason",
                                "token_ids"]  # fmt: skip
            assert ch["finish_reason"] == "length" and ch["stop_reason"] is None
            finished.add(i)
    assert finished == {0, 1} and counted == {0: 9, 1: 9}
    final = evs[-1]
    assert final["choices"] == []
    assert final["usage"] == {"prompt_tokens": n_prompt, "total_tokens": n_prompt + 18,
                              "completion_tokens": 18}  # fmt: skip


def test_completions_stream_chunk_shapes(vllm: RunningSim) -> None:
    """serving_completion.py completion_stream_generator: every CompletionResponseStreamChoice
    field, nulls included; 0.32: no ``usage`` key unless continuous usage (0.11 had
    ``usage: null``), whose object has the three counts only; continuous usage counts that
    prompt's tokens and that choice's tokens; the final usage chunk leaves out nulls."""
    prompts = ["The river", "A much longer prompt about the sea and the sky"]
    status, body = post(
        vllm,
        "/v1/completions",
        {
            "model": MODEL,
            "prompt": prompts,
            "max_tokens": 4,
            "temperature": 0,
            "logprobs": 0,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    assert status == 200
    evs = events(body)
    counts = [n for _, n in completion_prompts(prompts)]
    assert counts[0] != counts[1]
    seen = {0: 0, 1: 0}
    for e in evs[:-1]:
        assert list(e) == ["id", "object", "created", "model", "choices", "usage"]
        assert e["object"] == "text_completion"
        (ch,) = e["choices"]
        assert set(ch) == {"index", "text", "logprobs", "finish_reason", "stop_reason",
                           "prompt_token_ids", "token_ids"}  # fmt: skip
        i = ch["index"]
        seen[i] += len(ch["logprobs"]["tokens"])
        assert e["usage"] == {
            "prompt_tokens": counts[i],
            "total_tokens": counts[i] + seen[i],
            "completion_tokens": seen[i],
        }
    final = evs[-1]
    assert final["choices"] == [] and set(final["usage"]) == USAGE_KEYS
    assert final["usage"]["completion_tokens"] == 8
    assert final["usage"]["prompt_tokens"] == sum(counts)

    # without continuous usage no chunk carries the key (0.11: null on every chunk)
    status, body = post(
        vllm,
        "/v1/completions",
        {"model": MODEL, "prompt": "The river", "max_tokens": 3, "stream": True},
    )
    assert all("usage" not in e for e in events(body))


def test_completions_response_fields(vllm: RunningSim) -> None:
    """serving_completion.py request_output_to_completion_response: CompletionResponse with
    ``kv_transfer_params`` (0.32: and ``ec_transfer_params``, ``metrics``); each
    CompletionResponseChoice has ``stop_reason``, ``token_ids``, ``prompt_logprobs``,
    ``prompt_token_ids`` (0.32: and ``routed_experts``), null unless asked for."""
    status, body = post(
        vllm, "/v1/completions", {"model": MODEL, "prompt": "The river", "max_tokens": 3}
    )
    assert status == 200
    r = json.loads(body)
    for key in ("kv_transfer_params", "ec_transfer_params", "metrics", "service_tier"):
        assert key in r and r[key] is None, key
    assert r["usage"]["prompt_tokens_details"] is None  # model_dump(), nothing excluded
    assert r["usage"]["completion_tokens_details"] is None
    (ch,) = r["choices"]
    for key in ("stop_reason", "token_ids", "prompt_logprobs", "prompt_token_ids",
                "routed_experts"):  # fmt: skip
        assert key in ch and ch[key] is None, key


def test_logprobs_dict_holds_the_sampled_token_first(vllm: RunningSim) -> None:
    """v1/engine/logprobs.py puts the sampled token first in each position's dict, then the
    top-N; serving_completion.py keeps ``num_output_top_logprobs >= i`` entries (up to N+1),
    serving_chat.py ``_get_top_logprobs`` the first ``top_logprobs`` ones."""
    status, body = post(
        vllm,
        "/v1/completions",
        {"model": MODEL, "prompt": "The river", "max_tokens": 40, "temperature": 1.0,
         "seed": 11, "logprobs": 2},
    )  # fmt: skip
    assert status == 200
    lp = json.loads(body)["choices"][0]["logprobs"]
    sizes = set()
    for tok, tok_lp, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                strict=True):  # fmt: skip
        assert next(iter(top)) == tok and top[tok] == tok_lp
        sizes.add(len(top))
    assert sizes == {2, 3}  # 3 where the sampled token is not among the top 2

    # logprobs: 0 still returns the sampled token's entry
    status, body = post(
        vllm,
        "/v1/completions",
        {"model": MODEL, "prompt": "The river", "max_tokens": 5, "logprobs": 0},
    )
    lp = json.loads(body)["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"],
                                                         strict=True)]  # fmt: skip

    status, body = post(
        vllm,
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 40, "temperature": 1.0,
         "seed": 11, "logprobs": True, "top_logprobs": 2},
    )  # fmt: skip
    content = json.loads(body)["choices"][0]["logprobs"]["content"]
    for entry in content:
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["token"] == entry["token"]


def test_logprobs_limits_and_defaults(vllm: RunningSim) -> None:
    """v1 processor: more than max_logprobs (20) is a ValueError, answered 400
    BadRequestError; protocol.py: chat ``top_logprobs`` defaults to 0, and serving_chat.py
    returns logprobs only ``if request.logprobs and request.top_logprobs is not None``."""
    for path, extra in (
        ("/v1/chat/completions", {"messages": MESSAGES, "logprobs": True, "top_logprobs": 21}),
        ("/v1/completions", {"prompt": "The river", "logprobs": 21}),
    ):
        status, body = post(vllm, path, {"model": MODEL, "max_tokens": 2, **extra})
        assert status == 400
        err = json.loads(body)["error"]
        assert err["message"] == (
            "Requested sample logprobs of 21, which is greater than max allowed: 20"
            " (parameter=logprobs, value=21)"
        )
        assert err["type"] == "BadRequestError" and err["code"] == 400
        assert err["param"] == "logprobs"
    base = {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "logprobs": True}
    status, body = post(vllm, "/v1/chat/completions", base)
    content = json.loads(body)["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(e["top_logprobs"] == [] for e in content)
    status, body = post(vllm, "/v1/chat/completions", {**base, "top_logprobs": None})
    assert status == 200 and json.loads(body)["choices"][0]["logprobs"] is None


def test_error_bodies_and_plain_endpoints(vllm: RunningSim) -> None:
    """protocol.py ErrorResponse ``{"error": {message, type, param, code}}``;
    serving_engine.py ``_check_model``: 404 NotFoundError; api_server.py: ``/health`` 200 with
    an empty body, ``/version`` ``{"version": VLLM_VERSION}``; unknown fields are logged and
    ignored (OpenAIBaseModel ``extra="allow"``)."""
    status, body = post(vllm, "/v1/chat/completions",
                        {"model": "other", "messages": MESSAGES})  # fmt: skip
    assert status == 404
    assert json.loads(body) == {"error": {"message": "The model `other` does not exist. "
                                                     f"Valid aliases: {MODEL}.",
                                          "type": "NotFoundError", "param": "model",
                                          "code": 404}}  # fmt: skip
    status, body = post(vllm, "/v1/chat/completions",
                        {"model": MODEL, "messages": MESSAGES, "max_tokens": 2,
                         "no_such_field": {"x": 1}})  # fmt: skip
    assert status == 200
    # 0.32: a model validator's VLLMValidationError is BadRequestError, with its parameter
    status, body = post(vllm, "/v1/chat/completions",
                        {"model": MODEL, "messages": MESSAGES,
                         "stream_options": {"include_usage": True}})  # fmt: skip
    assert status == 400
    assert json.loads(body)["error"] == {
        "message": "Stream options can only be defined when `stream=True`."
        " (parameter=stream_options)",
        "type": "BadRequestError",
        "param": "stream_options",
        "code": 400,
    }
    # validation_exception_handler: what pydantic refuses is "Bad Request", param its location
    status, body = post(vllm, "/v1/completions", {"model": MODEL, "prompt": "x", "n": 0})
    err = json.loads(body)["error"]
    assert status == 400 and (err["type"], err["param"]) == ("Bad Request", "body.n")
    assert err["message"].startswith("1 validation error:\n  {'type': 'greater_than_equal'")
    assert http_get(vllm.base_url + "/health") == (200, b"")
    assert json.loads(http_get(vllm.base_url + "/version")[1]) == {"version": "0.32.0"}


def test_system_fingerprint_where_vllm_0_32_puts_it(vllm: RunningSim) -> None:
    """vLLM 0.32 (seen on the real server, ``serving_chat.py`` / ``serving_completion.py``):
    ``system_fingerprint`` is in whole answers; in a stream it is the last member of each
    choice's finish chunk unless ``include_usage`` asks for a usage chunk, which then carries
    it instead (and no finish chunk does). Its value follows ``/version``."""
    version = json.loads(http_get(vllm.base_url + "/version")[1])["version"]
    fp = f"vllm-{version}-"
    chat = {"model": MODEL, "messages": MESSAGES, "max_tokens": 4, "temperature": 0}
    cmpl = {"model": MODEL, "prompt": "The river", "max_tokens": 4, "temperature": 0}
    for path, body in (("/v1/chat/completions", chat), ("/v1/completions", cmpl)):
        status, raw = post(vllm, path, body)
        assert status == 200 and json.loads(raw)["system_fingerprint"].startswith(fp)
        for n in (1, 2):
            streamed = {**body, "stream": True, "n": n, "seed": 1}
            status, raw = post(vllm, path, streamed)
            evs = events(raw)
            finish = [e for e in evs if e["choices"] and e["choices"][0]["finish_reason"]]
            assert len(finish) == n and all(e["system_fingerprint"].startswith(fp) for e in finish)
            assert all(list(e)[-1] == "system_fingerprint" for e in finish)
            assert sum("system_fingerprint" in e for e in evs) == n
            status, raw = post(vllm, path, {**streamed, "stream_options": {"include_usage": True}})
            evs = events(raw)
            assert [("system_fingerprint" in e) for e in evs] == [False] * (len(evs) - 1) + [True]
            assert evs[-1]["choices"] == [] and evs[-1]["system_fingerprint"].startswith(fp)


def _families(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_vllm_metric_names_types_labels_buckets(vllm: RunningSim) -> None:
    """v1/metrics/loggers.py PrometheusStatLogger, as vLLM 0.32.0 shows it: names, types, the
    labels ``engine`` and ``model_name`` written sorted by name (0.32's prometheus_client),
    ``finished_reason`` on request_success, ``build_1_2_5_buckets(max_model_len)`` for token
    counts; 0.11's deprecated ``time_per_output_token_seconds`` is gone, a per-request
    ``request_time_per_output_token_seconds`` (one observation per request) came."""
    post(vllm, "/v1/chat/completions",
         {"model": MODEL, "messages": MESSAGES, "max_tokens": 5, "n": 2})  # fmt: skip
    text = http_get(vllm.base_url + "/metrics")[1].decode()
    fam = _families(text)
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prefix_cache_queries_total": "counter",
        "vllm:prefix_cache_hits_total": "counter",
        "vllm:num_preemptions_total": "counter",
        "vllm:prompt_tokens_total": "counter",
        "vllm:generation_tokens_total": "counter",
        "vllm:request_success_total": "counter",
        "vllm:request_prompt_tokens": "histogram",
        "vllm:request_generation_tokens": "histogram",
        "vllm:iteration_tokens_total": "histogram",
        "vllm:request_max_num_generation_tokens": "histogram",
        "vllm:request_params_n": "histogram",
        "vllm:request_params_max_tokens": "histogram",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:request_time_per_output_token_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected.items():
        assert fam.get(name) == kind, name
    assert "vllm:gpu_cache_usage_perc" not in fam  # hidden since 0.11
    assert "vllm:time_per_output_token_seconds" not in fam  # removed after 0.11
    model = 'model_name="sim-llama-3-8b-instruct"'
    labels = f'engine="0",{model}'
    for reason in ("stop", "length", "abort", "error", "repetition"):
        assert (
            f'vllm:request_success_total{{engine="0",finished_reason="{reason}",{model}}}' in text
        )
    assert f"vllm:num_requests_running{{{labels}}} 0.0" in text
    les = re.findall(r'^vllm:request_prompt_tokens_bucket\{[^}]*le="([^"]+)"', text, re.M)
    assert les == [repr(float(b)) for b in build_1_2_5_buckets(8192)] + ["+Inf"]
    assert les[-2] == "5000.0"

    def value(sample: str) -> float:
        return float(re.search(rf"^{re.escape(sample)} (\S+)$", text, re.M)[1])  # type: ignore[index]

    def bucket(name: str, le: str) -> float:
        return value(f'{name}_bucket{{engine="0",le="{le}",{model}}}')

    requests = value(f"vllm:e2e_request_latency_seconds_count{{{labels}}}")
    assert value(f"vllm:inter_token_latency_seconds_count{{{labels}}}") > requests > 0
    assert value(f"vllm:request_time_per_output_token_seconds_count{{{labels}}}") == requests
    n_le = {le: bucket("vllm:request_params_n", le) for le in ("1.0", "2.0")}
    assert n_le["2.0"] - n_le["1.0"] >= 1  # the n=2 request
    assert bucket("vllm:request_params_max_tokens", "5.0") >= 1


def test_build_1_2_5_buckets() -> None:
    """loggers.py docstring: build_1_2_5_buckets(100) == [1, 2, 5, 10, 20, 50, 100]."""
    assert build_1_2_5_buckets(100) == (1, 2, 5, 10, 20, 50, 100)
    assert build_1_2_5_buckets(4096)[-1] == 2000


def test_trtllm_prometheus_metrics_behind_return_perf_metrics() -> None:
    """openai_server.py mounts ``/prometheus/metrics`` (multiprocess registry) only when the LLM
    args have ``return_perf_metrics``; MetricsCollector labels ``model_name="undefined",
    engine_type="undefined"``, ``trtllm_`` names; the /metrics JSON stats stay as they are."""
    with running_sim("trtllm", "clean", overrides=FAST) as plain:
        assert http_get(plain.base_url + "/prometheus/metrics")[0] == 404
    with running_sim("vllm", "clean", overrides={**FAST, "return_perf_metrics": True}) as v:
        assert http_get(v.base_url + "/prometheus/metrics")[0] == 404
    overrides = {**FAST, "return_perf_metrics": True}
    with running_sim("trtllm", "clean", overrides=overrides) as trt:
        status, body = http_get(trt.base_url + "/prometheus/metrics")
        assert status == 200 and b"trtllm_request_success_total" not in body
        for max_tokens in (4, 4, 200):
            post(trt, "/v1/chat/completions",
                 {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens})  # fmt: skip
        text = http_get(trt.base_url + "/prometheus/metrics")[1].decode()
        fam = _families(text)
        # a zero queue time is not observed (log_request_metrics_dict skips falsy values), so
        # the queue histogram may be absent when every request was admitted at once
        fam.setdefault("trtllm_request_queue_time_seconds", "histogram")
        assert fam == {
            "trtllm_request_success_total": "counter",
            "trtllm_e2e_request_latency_seconds": "histogram",
            "trtllm_time_to_first_token_seconds": "histogram",
            "trtllm_time_per_output_token_seconds": "histogram",
            "trtllm_request_queue_time_seconds": "histogram",
            "trtllm_kv_cache_hit_rate": "gauge",
            "trtllm_kv_cache_utilization": "gauge",
        }
        labels = 'model_name="undefined",engine_type="undefined"'
        assert f'trtllm_request_success_total{{{labels},finished_reason="length"}} 2.0' in text
        assert f'trtllm_request_success_total{{{labels},finished_reason="stop"}} 1.0' in text
        assert f"trtllm_e2e_request_latency_seconds_count{{{labels}}} 3.0" in text
        assert re.search(rf'^trtllm_kv_cache_utilization\{{{labels},pid="\d+"\}} ', text, re.M)
        assert "_created" not in text and "process_" not in text
        assert json.loads(http_get(trt.base_url + "/metrics")[1])  # JSON stats unchanged
