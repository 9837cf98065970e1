"""Comparing real engines' answers.

Two requests to real vLLM give the same bytes when not streamed. Streamed, the same tokens and
fields come in the same order, but where the tokens are cut into chunks depends on timing: when
the API server falls behind the engine (easy with a tiny model), several tokens leave in one
chunk (seen in 7 of 120 back-to-back requests). So streams are compared as
:func:`stream_shape`: every byte of every event except the text of content chunks, with runs of
text-only chunks merged, plus the whole text; with several choices, that per choice
(:func:`per_choice`).
"""

from __future__ import annotations

import re

_ID = re.compile(rb'"id":\s*"[^"]*"')
_CREATED = re.compile(rb'"created":\s*\d+')


def normalize(body: bytes) -> bytes:
    """An answer's bytes with the per-request ``id`` and ``created`` values blanked out."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":"-"', body))


_TEXT = re.compile(rb'"(content|text)":"((?:[^"\\]|\\.)*)"')


def stream_shape(raw: bytes) -> tuple[list[bytes], bytes]:
    """A stream's events with their text blanked (a run of text-only chunks as one event), and
    the text joined."""
    events: list[bytes] = []
    text = b""
    for event in normalize(raw).split(b"\n\n"):
        text += b"".join(m.group(2) for m in _TEXT.finditer(event))
        blank = _TEXT.sub(rb'"\1":"~"', event)
        if events and blank == events[-1] and b'"finish_reason":null' in blank:
            continue  # one more chunk of the same text-only kind
        events.append(blank)
    return events, text


_INDEX = re.compile(rb'"choices":\[\{"index":(\d+)')


def per_choice(raw: bytes) -> dict[int, tuple[list[bytes], bytes]]:
    """A stream's :func:`stream_shape` per choice (events without a choice under -1). With
    ``n > 1`` vLLM runs each choice as its own request, so how their chunks interleave depends
    on timing too; each choice's own sequence does not."""
    groups: dict[int, list[bytes]] = {}
    for event in raw.split(b"\n\n"):
        m = _INDEX.search(event)
        groups.setdefault(int(m.group(1)) if m else -1, []).append(event + b"\n\n")
    return {i: stream_shape(b"".join(events)) for i, events in groups.items()}


def same_answer(mirrored: bytes, direct: bytes, stream: bool) -> None:
    if not stream:
        assert normalize(mirrored) == normalize(direct)
    elif len(per_choice(direct)) > 2:  # several choices, plus the events of none
        assert per_choice(mirrored) == per_choice(direct)
    else:
        assert stream_shape(mirrored) == stream_shape(direct)


def vllm_metric(base_url: str, name: str, **labels: str) -> float:
    """The sum of real vLLM's ``/metrics`` samples named ``name`` whose labels include
    ``labels`` (0 when there are none)."""
    from prometheus_client.parser import text_string_to_metric_families

    from shadow_ab.dev.processes import http_get

    status, body = http_get(base_url + "/metrics", timeout=10.0)
    assert status == 200, f"GET /metrics answered {status}"
    return sum(
        s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def wait_idle(base_url: str, timeout: float = 900.0) -> None:
    """Wait until real vLLM runs and queues no request (a request it did not abort ends by
    itself well within ``timeout``: 1000 tokens of the tiny model take a minute or two)."""
    import time

    deadline = time.monotonic() + timeout
    while (
        vllm_metric(base_url, "vllm:num_requests_running")
        + vllm_metric(base_url, "vllm:num_requests_waiting")
    ) > 0:
        assert time.monotonic() < deadline, f"vLLM still busy after {timeout:.0f}s"
        time.sleep(0.2)
