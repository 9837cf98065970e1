"""Each flavor's wire format, through the official openai client and raw HTTP."""

from __future__ import annotations

import json
import urllib.request

import openai
import pytest

from shadow_ab.dev.processes import RunningSim, http_get
from simulator.generate import complete, natural_length, prompt_state
from simulator.wire import chat_prompt, completion_prompts

MODEL = "sim-llama-3-8b-instruct"
MESSAGES = [{"role": "user", "content": "Where is New York?"}]


def client(sim: RunningSim) -> openai.OpenAI:
    return openai.OpenAI(base_url=sim.v1, api_key="unused", max_retries=0, timeout=30)


def reference_text(prompt: str, seed: int | None, max_tokens: int | None) -> tuple[str, int]:
    start = prompt_state(MODEL, prompt, seed)
    c = complete(start, natural=natural_length(start, 24, 60), max_tokens=max_tokens)
    return c.text, len(c.tokens)


def raw_post(sim: RunningSim, path: str, body: dict) -> bytes:
    req = urllib.request.Request(
        sim.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def test_chat_greedy_is_the_reference_answer(sim: RunningSim) -> None:
    r = client(sim).chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, seed=3)
    text, n = reference_text(chat_prompt(MESSAGES)[0], 3, None)
    choice = r.choices[0]
    assert choice.message.content == text
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "stop"
    assert r.usage is not None and r.usage.completion_tokens == n
    assert r.usage.prompt_tokens == chat_prompt(MESSAGES)[1]
    assert r.model == MODEL and r.id.startswith("chatcmpl-")


def test_chat_stream_matches_and_counts_pieces(sim: RunningSim) -> None:
    c = client(sim)
    full = c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, max_tokens=20)
    stream = c.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        max_tokens=20,
        stream=True,
        logprobs=True,
        top_logprobs=3,
        stream_options={"include_usage": True},
    )
    text, pieces, finish, usage, roles = "", 0, None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            text += ch.delta.content or ""
            if ch.logprobs is not None and ch.logprobs.content:
                for entry in ch.logprobs.content:
                    pieces += 1
                    assert len(entry.top_logprobs) == 3
                    assert entry.top_logprobs[0].token == entry.token  # greedy: the top one
                    assert entry.top_logprobs[0].logprob == entry.logprob
            if ch.finish_reason:
                finish = ch.finish_reason
    assert roles == ["assistant"]
    assert text == full.choices[0].message.content
    assert finish == "length" == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == pieces == 20


def test_completions_default_max_tokens_differ(sim: RunningSim) -> None:
    r = client(sim).completions.create(model=MODEL, prompt="The river", temperature=0)
    text, n = reference_text(completion_prompts("The river")[0][0], None, None)
    assert r.usage is not None
    if sim.flavor == "vllm":  # vLLM: 16 tokens unless told otherwise
        assert r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length"
    else:  # TensorRT-LLM: no default, runs to end-of-sequence
        assert r.usage.completion_tokens == n and r.choices[0].finish_reason == "stop"
        assert r.choices[0].text == text


def test_completions_stream_with_logprobs(sim: RunningSim) -> None:
    c = client(sim)
    stream = c.completions.create(
        model=MODEL,
        prompt="The river",
        temperature=0,
        max_tokens=12,
        logprobs=2,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, tokens, usage, finish = "", [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs is not None:
                assert ch.logprobs.tokens is not None and ch.logprobs.top_logprobs is not None
                tokens += ch.logprobs.tokens
                for tok, top in zip(ch.logprobs.tokens, ch.logprobs.top_logprobs, strict=True):
                    assert top is not None and len(top) == 2 and tok in top
            finish = ch.finish_reason or finish
    ref, _ = reference_text("The river", None, 12)
    assert text == ref == "".join(tokens)
    assert usage is not None and usage.completion_tokens == len(tokens) == 12
    assert finish == "length"


def test_seeded_sampling_and_n(sim: RunningSim) -> None:
    c = client(sim)
    kw = {"model": MODEL, "messages": MESSAGES, "temperature": 0.9, "seed": 11, "n": 3}
    a = c.chat.completions.create(**kw)
    b = c.chat.completions.create(**kw)
    texts = [ch.message.content for ch in a.choices]
    assert texts == [ch.message.content for ch in b.choices]
    assert len(set(texts)) == 3
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    unseeded = {
        c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0.9)
        .choices[0]
        .message.content
        for _ in range(3)
    }
    assert len(unseeded) == 3
    greedy = c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, n=2)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    assert a.usage is not None
    streamed = c.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    per_choice: dict[int, str] = {}
    usage = None
    for chunk in streamed:
        usage = chunk.usage or usage
        for ch in chunk.choices:
            per_choice[ch.index] = per_choice.get(ch.index, "") + (ch.delta.content or "")
    assert [per_choice[i] for i in range(3)] == texts
    assert usage is not None and usage.completion_tokens == a.usage.completion_tokens


def test_stop_sequences(sim: RunningSim) -> None:
    c = client(sim)
    full = c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0).choices[0]
    text = full.message.content or ""
    stop = text.split()[5]
    r = c.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=0, stop=[stop])
    ch = r.choices[0]
    assert ch.message.content == text[: text.find(stop)]
    assert ch.finish_reason == "stop"
    stream = c.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        temperature=0,
        stop=stop,
        stream=True,
        logprobs=True,
        stream_options={"include_usage": True},
    )
    got, pieces, usage = "", 0, None
    for chunk in stream:
        usage = chunk.usage or usage
        for d in chunk.choices:
            got += d.delta.content or ""
            pieces += len(d.logprobs.content or []) if d.logprobs else 0
    assert got == ch.message.content
    assert usage is not None and usage.completion_tokens == pieces


def test_unknown_fields_trtllm_rejects_vllm_ignores(sim: RunningSim) -> None:
    c = client(sim)
    kw = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 4,
        "extra_body": {"guided_choice": ["a"]},
    }
    if sim.flavor == "trtllm":
        with pytest.raises(openai.BadRequestError) as exc:
            c.chat.completions.create(**kw)
        assert exc.value.status_code == 400
        assert "Extra inputs are not permitted" in json.dumps(exc.value.body)
    else:
        assert c.chat.completions.create(**kw).choices[0].finish_reason == "length"


def test_model_name_checked_by_vllm_only(sim: RunningSim) -> None:
    c = client(sim)
    if sim.flavor == "vllm":
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            c.chat.completions.create(model="other", messages=MESSAGES, max_tokens=2)
    else:
        r = c.chat.completions.create(model="other", messages=MESSAGES, max_tokens=2)
        assert r.usage is not None and r.usage.completion_tokens == 2


def test_bad_requests_are_400s(sim: RunningSim) -> None:
    c = client(sim)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(
            model=MODEL, messages=MESSAGES, stream_options={"include_usage": True}
        )
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, top_logprobs=3)
    too_long = (
        "cannot be greater than max_model_len" if sim.flavor == "vllm" else "maximum context length"
    )
    with pytest.raises(openai.BadRequestError, match=too_long):
        c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=100_000)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=MODEL, messages=[])


def test_stream_framing_raw(sim: RunningSim) -> None:
    body = raw_post(
        sim,
        "/v1/chat/completions",
        {"model": MODEL, "messages": MESSAGES, "max_tokens": 3, "stream": True, "temperature": 0},
    )
    events = body.split(b"\n\n")
    assert events[-1] == b"" and events[-2].strip() == b"data: [DONE]"
    first = json.loads(events[0].removeprefix(b"data: "))
    delta = first["choices"][0]["delta"]
    if sim.flavor == "trtllm":
        assert events[0].endswith(b" ")  # TensorRT-LLM's space before the blank line
        assert delta == {"role": "assistant"}
    else:
        assert not events[0].endswith(b" ")
        assert delta == {"role": "assistant", "content": ""}
    last = json.loads(events[-3].removeprefix(b"data: "))
    assert last["choices"][0]["finish_reason"] == "length"
    # vLLM always sends stop_reason on the finishing chunk; TensorRT-LLM leaves None out.
    assert ("stop_reason" in last["choices"][0]) is (sim.flavor == "vllm")


def test_models_health_version(sim: RunningSim) -> None:
    models = client(sim).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == ("vllm" if sim.flavor == "vllm" else "tensorrt_llm")
    assert http_get(sim.base_url + "/health") == (200, b"")
    status, body = http_get(sim.base_url + "/version")
    assert status == 200
    assert json.loads(body) == {"version": "0.32.0" if sim.flavor == "vllm" else "1.2.0rc2"}


def test_metrics_in_the_flavors_format(sim: RunningSim) -> None:
    client(sim).chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5)
    status, body = http_get(sim.base_url + "/metrics")
    assert status == 200
    if sim.flavor == "vllm":
        text = body.decode()
        for name in (
            "vllm:num_requests_running{",
            "vllm:num_requests_waiting{",
            "vllm:kv_cache_usage_perc{",
            "vllm:time_to_first_token_seconds_bucket{",
            "vllm:inter_token_latency_seconds_count{",
            "vllm:e2e_request_latency_seconds_sum{",
            "vllm:generation_tokens_total{",
            "process_start_time_seconds ",
            "process_resident_memory_bytes ",
        ):
            assert name in text, name
        assert "sim:time_scale" not in text
    else:
        stats = json.loads(body)
        assert isinstance(stats, list) and stats
        for key in ("iter", "iterLatencyMS", "numActiveRequests", "numQueuedRequests",
                    "gpuMemUsage", "cpuMemUsage", "kvCacheStats", "inflightBatchingStats",
                    "timestamp"):  # fmt: skip
            assert key in stats[-1], key
        assert "simTimeScale" not in stats[-1]
        assert [s["iter"] for s in stats] == sorted(s["iter"] for s in stats)
        assert http_get(sim.base_url + "/metrics") == (200, b"[]")  # drained by the read
