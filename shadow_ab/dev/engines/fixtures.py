"""Wire fixtures of a real engine, and the structural comparison the simulator is held to.

:data:`MATRIX` is a fixed set of requests (chat and completions, streamed or not, with and
without ``include_usage``, logprobs, ``n=2``, stop strings, and the errors: unknown model,
prompt too long, bad JSON, failed validation) plus the plain endpoints (``/v1/models``,
``/version``, ``/health``, ``/metrics``). :func:`record` asks a running server each of them
and writes what came back, one JSON file per case (status, headers, body or SSE frames), with
only what varies per request normalised: ``id``, ``created``, the ``date`` header, and header
values that follow from those (``content-length``). ``/metrics`` is kept as Prometheus text.

:func:`shape` reduces an answer to its structure: for JSON, the keys in their order with the
JSON type of each value; for a stream, the set of shapes per chunk kind (:func:`chunk_kind`),
since where an engine cuts the text into chunks depends on timing. :func:`differences` lists
where two answers' structures differ; the fixture tests hold the simulator's vLLM flavor to the
recorded answers of real vLLM with it, and the live test to a running one.

``shadow-ab engine vllm record-fixtures --out tests/fixtures/vllm-<version>/`` records them.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MODEL = "tiny-llama"
MAX_MODEL_LEN = 1024
"""What the fixtures were recorded with (the server ``shadow-ab engine vllm serve`` runs)."""

_MESSAGES = [{"role": "user", "content": "Tell me about the river and the bridge"}]
_STOP = [" ", "e"]  # at least one of them shows up in any text of a few tokens
USAGE = {"include_usage": True}
CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": _MESSAGES, "max_tokens": 6, "temperature": 0, **extra}


def _cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "The river", "max_tokens": 6, "temperature": 0, **extra}


@dataclass(frozen=True)
class Case:
    """One request of the matrix: ``body`` is a JSON object, or raw bytes sent as they are."""

    name: str
    method: str
    path: str
    body: dict[str, Any] | str | None = None

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))


def _post(name: str, path: str, body: dict[str, Any] | str) -> Case:
    return Case(name, "POST", path, body)


CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"

MATRIX: tuple[Case, ...] = (
    # chat
    _post("chat", CHAT, _chat()),
    _post("chat-stream", CHAT, _chat(stream=True)),
    _post("chat-stream-usage", CHAT, _chat(stream=True, stream_options=USAGE)),
    _post("chat-stream-options-empty", CHAT, _chat(stream=True, stream_options={})),
    _post("chat-stream-continuous", CHAT, _chat(stream=True, stream_options=CONTINUOUS)),
    _post("chat-logprobs", CHAT, _chat(logprobs=True, top_logprobs=2)),
    _post("chat-logprobs-default-top", CHAT, _chat(logprobs=True)),
    _post("chat-stream-logprobs", CHAT, _chat(stream=True, logprobs=True, top_logprobs=2)),
    _post("chat-n2", CHAT, _chat(n=2, temperature=1.0, seed=7)),
    _post(
        "chat-stream-n2-usage",
        CHAT,
        _chat(stream=True, n=2, temperature=1.0, seed=7, stream_options=USAGE),
    ),
    _post("chat-stop", CHAT, _chat(stop=_STOP)),
    _post("chat-stream-stop", CHAT, _chat(stream=True, stop=_STOP)),
    _post("chat-404-model", CHAT, _chat(model="no-such-model")),
    _post("chat-400-too-long", CHAT, _chat(max_tokens=5000)),
    _post("chat-400-top-logprobs-without-logprobs", CHAT, _chat(top_logprobs=2)),
    _post("chat-400-too-many-logprobs", CHAT, _chat(logprobs=True, top_logprobs=21)),
    _post("chat-400-stream-options-without-stream", CHAT, _chat(stream_options=USAGE)),
    _post("chat-400-bad-json", CHAT, '{"model": "tiny-llama", "messages": ['),
    # completions
    _post("cmpl", CMPL, _cmpl()),
    _post("cmpl-stream", CMPL, _cmpl(stream=True)),
    _post("cmpl-stream-usage", CMPL, _cmpl(stream=True, stream_options=USAGE)),
    _post(
        "cmpl-stream-usage-false", CMPL, _cmpl(stream=True, stream_options={"include_usage": False})
    ),
    _post("cmpl-stream-continuous", CMPL, _cmpl(stream=True, stream_options=CONTINUOUS)),
    _post("cmpl-logprobs", CMPL, _cmpl(logprobs=2)),
    _post("cmpl-stream-logprobs", CMPL, _cmpl(stream=True, logprobs=2)),
    _post("cmpl-n2", CMPL, _cmpl(n=2, temperature=1.0, seed=7)),
    _post(
        "cmpl-stream-n2-usage",
        CMPL,
        _cmpl(stream=True, n=2, temperature=1.0, seed=7, stream_options=USAGE),
    ),
    _post("cmpl-stop", CMPL, _cmpl(stop=_STOP)),
    _post("cmpl-stream-stop", CMPL, _cmpl(stream=True, stop=_STOP)),
    _post("cmpl-404-model", CMPL, _cmpl(model="no-such-model")),
    _post("cmpl-400-too-long", CMPL, _cmpl(prompt="the river " * 600)),
    _post("cmpl-400-too-many-logprobs", CMPL, _cmpl(logprobs=21)),
    _post("cmpl-400-bad-json", CMPL, "{not json"),
    # the plain endpoints
    Case("models", "GET", "/v1/models"),
    Case("version", "GET", "/version"),
    Case("health", "GET", "/health"),
)
METRICS = Case("metrics", "GET", "/metrics")
"""Asked last, after the matrix, so its histograms have observations."""

HEADERS_THAT_MATTER = ("content-type", "content-length", "transfer-encoding", "cache-control")
"""Headers a client or the mirror acts on; the rest (``date``, ``server``) are kept in the
fixture files for the record, not compared."""


# -- asking ------------------------------------------------------------------------------------


@dataclass
class Answer:
    """What a server answered to one case."""

    status: int
    headers: list[tuple[str, str]]
    raw: bytes

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)


def ask(base_url: str, case: Case, timeout: float = 300.0) -> Answer:
    """Send one case to ``base_url`` and read the whole answer (http.client: raw bytes, headers
    in the order they came)."""
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=timeout)
    try:
        data: bytes | None = None
        headers: dict[str, str] = {}
        if case.body is not None:
            data = (
                case.body.encode() if isinstance(case.body, str) else json.dumps(case.body).encode()
            )
            headers["Content-Type"] = "application/json"
        conn.request(case.method, case.path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        return Answer(resp.status, [(k.lower(), v) for k, v in resp.getheaders()], raw)
    finally:
        conn.close()


# -- normalising and storing -------------------------------------------------------------------

_VARYING = {"id": "<id>", "created": 0}


def _normalise_json(obj: Any) -> Any:
    """``id`` and ``created`` blanked; ``root`` (the model's folder on the recording machine,
    in ``/v1/models``) as ``<model path>``."""
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if k in _VARYING:
                out[k] = _VARYING[k]
            elif k == "root" and isinstance(v, str) and v.startswith("/"):
                out[k] = "<model path>"
            else:
                out[k] = _normalise_json(v)
        return out
    if isinstance(obj, list):
        return [_normalise_json(v) for v in obj]
    return obj


def sse_frames(raw: bytes) -> list[str]:
    """A stream's events, each without its ``\\n\\n`` separator; raises ValueError when the
    bytes are not whole events."""
    text = raw.decode()
    if not text.endswith("\n\n"):
        raise ValueError(f"an SSE body should end with a blank line: ...{text[-80:]!r}")
    return text[:-2].split("\n\n")


def _normalise_frame(frame: str) -> str:
    if not frame.startswith("data: {"):
        return frame
    payload = frame.removeprefix("data: ")
    tail = payload[len(payload.rstrip()) :]
    obj = json.loads(payload)
    return "data: " + json.dumps(_normalise_json(obj), separators=(",", ":")) + tail


def _is_sse(answer: Answer) -> bool:
    return (answer.header("content-type") or "").startswith("text/event-stream")


def to_fixture(case: Case, answer: Answer) -> dict[str, Any]:
    """One case's fixture: the request, and the answer with what varies normalised."""
    headers = []
    for k, v in answer.headers:
        if k == "date":
            v = "<date>"
        elif k == "content-length":
            v = "<n>"
        headers.append([k, v])
    out: dict[str, Any] = {
        "name": case.name,
        "request": {"method": case.method, "path": case.path, "body": case.body},
        "status": answer.status,
        "headers": headers,
    }
    if _is_sse(answer):
        out["sse"] = [_normalise_frame(f) for f in sse_frames(answer.raw)]
    elif (answer.header("content-type") or "").startswith("application/json"):
        out["json"] = _normalise_json(json.loads(answer.raw))
    else:
        out["text"] = answer.raw.decode(errors="replace")
    return out


def record(
    base_url: str, out: Path, *, meta: dict[str, Any], log: Callable[[str], None] = print
) -> list[Path]:
    """Ask ``base_url`` the whole matrix, then ``/metrics``; write ``<case>.json`` per case,
    ``metrics.txt`` and ``meta.json`` into ``out``. Returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case in MATRIX:
        answer = ask(base_url, case)
        fixture = to_fixture(case, answer)
        path = out / f"{case.name}.json"
        path.write_text(json.dumps(fixture, indent=1, ensure_ascii=False) + "\n")
        log(f"{case.name}: {answer.status}, {len(answer.raw)} bytes")
        written.append(path)
    metrics = ask(base_url, METRICS)
    if metrics.status != 200:
        raise RuntimeError(f"/metrics answered {metrics.status}: {metrics.raw[:300]!r}")
    (out / "metrics.txt").write_text(metrics.raw.decode())
    headers = [
        [k, {"date": "<date>", "content-length": "<n>"}.get(k, v)] for k, v in metrics.headers
    ]
    (out / "metrics-headers.json").write_text(json.dumps(headers, indent=1) + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    written += [out / "metrics.txt", out / "metrics-headers.json", out / "meta.json"]
    return written


def load(folder: Path) -> dict[str, dict[str, Any]]:
    """The fixtures in ``folder`` by case name (``metrics``, ``meta`` not included)."""
    return {
        p.stem: json.loads(p.read_text())
        for p in sorted(folder.glob("*.json"))
        if p.stem not in ("meta", "metrics-headers")
    }


# -- structure ---------------------------------------------------------------------------------


def _type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "str"
    raise TypeError(type(value))


def shape(value: Any, *, maps: bool = False) -> Any:
    """A JSON value's structure: objects as ``[[key, shape], ...]`` in their order, arrays as the
    distinct shapes of their items in order of appearance (``[]`` when empty), scalars as their
    JSON type. ``maps``: the value's objects are maps from data to values (completions'
    ``top_logprobs`` entries, keyed by token), shaped as ``{"map": shapes of the values}``."""
    if isinstance(value, dict):
        if maps:
            return {"map": _distinct(shape(v) for v in value.values())}
        logprobs_of_completions = "text_offset" in value
        return [
            [k, shape(v, maps=logprobs_of_completions and k == "top_logprobs")]
            for k, v in value.items()
        ]
    if isinstance(value, list):
        return _distinct(shape(v, maps=maps) for v in value)
    return _type(value)


def _distinct(items: Iterable[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if item not in out:
            out.append(item)
    return out


def chunk_kind(chunk: dict[str, Any]) -> str:
    """What a stream chunk is: ``usage`` (no choices), ``role`` (a chat choice's first delta),
    ``finish`` (a choice's last chunk), else ``token``."""
    choices = chunk.get("choices") or []
    if not choices:
        return "usage"
    choice = choices[0]
    if "role" in (choice.get("delta") or {}):
        return "role"
    if choice.get("finish_reason") is not None:
        return "finish"
    return "token"


@dataclass
class StreamShape:
    """A stream reduced to what does not depend on timing."""

    prefix: str  # what comes before each event's payload
    suffix: str  # what follows each payload before the blank line
    last: str  # the last event
    kinds: list[str]  # the kinds in order, runs of one kind as one
    chunks: dict[str, list[Any]] = field(default_factory=dict)  # the shapes seen per kind


def stream_shape(frames: list[str]) -> StreamShape:
    events = [f for f in frames if f != "data: [DONE]"]
    prefixes = _distinct(f[: f.index("{")] for f in events)
    suffixes = _distinct(f[len(f.rstrip()) :] for f in events)
    if len(prefixes) > 1 or len(suffixes) > 1:
        raise ValueError(f"mixed SSE framing: prefixes {prefixes}, suffixes {suffixes}")
    kinds: list[str] = []
    chunks: dict[str, list[Any]] = {}
    for frame in events:
        obj = json.loads(frame[len(prefixes[0]) :])
        kind = chunk_kind(obj)
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
        seen = chunks.setdefault(kind, [])
        if shape(obj) not in seen:
            seen.append(shape(obj))
    return StreamShape(prefixes[0] if prefixes else "", suffixes[0] if suffixes else "",
                       frames[-1] if frames else "", kinds, chunks)  # fmt: skip


def _collapse_choices(kinds: list[str]) -> list[str]:
    """With ``n > 1`` the choices' chunks interleave by timing: keep the order of first
    appearance of each kind."""
    return _distinct(kinds)


def _path_diffs(a: Any, b: Any, where: str) -> list[str]:
    """Where two shapes differ, as readable lines (first difference per branch)."""
    if a == b:
        return []
    if (
        isinstance(a, list)
        and isinstance(b, list)
        and all(isinstance(x, list) and len(x) == 2 and isinstance(x[0], str) for x in a + b)
        and a
        and b
    ):
        keys_a, keys_b = [k for k, _ in a], [k for k, _ in b]
        if keys_a != keys_b:
            return [f"{where}: keys {keys_a} != {keys_b}"]
        out = []
        for (k, va), (_, vb) in zip(a, b, strict=True):
            out += _path_diffs(va, vb, f"{where}.{k}")
        return out
    return [f"{where}: {json.dumps(a)} != {json.dumps(b)}"]


def fixture_shape(fixture: dict[str, Any]) -> dict[str, Any]:
    """A fixture's (or :func:`to_fixture` answer's) structure, ready to compare."""
    out: dict[str, Any] = {"status": fixture["status"]}
    headers = dict((k, v) for k, v in fixture["headers"])
    out["headers"] = {
        k: (headers[k] if k != "content-length" else "<n>")
        for k in HEADERS_THAT_MATTER
        if k in headers
    }
    if "sse" in fixture:
        s = stream_shape(fixture["sse"])
        n = (fixture["request"]["body"] or {}).get("n", 1)
        out["sse"] = {
            "prefix": s.prefix,
            "suffix": s.suffix,
            "last": s.last,
            "kinds": _collapse_choices(s.kinds) if n > 1 else s.kinds,
            "chunks": s.chunks,
        }
    elif "json" in fixture:
        out["json"] = shape(fixture["json"])
    else:
        out["text"] = fixture["text"]
    return out


def differences(
    expected: dict[str, Any], actual: dict[str, Any], *, text: bool = True
) -> list[str]:
    """How ``actual``'s structure departs from ``expected``'s (both fixtures); empty if none.
    ``text``: compare non-JSON bodies byte for byte."""
    a, b = fixture_shape(expected), fixture_shape(actual)
    out = []
    if a["status"] != b["status"]:
        out.append(f"status {a['status']} != {b['status']}")
    for k in sorted(set(a["headers"]) | set(b["headers"])):
        if a["headers"].get(k) != b["headers"].get(k):
            out.append(f"header {k}: {a['headers'].get(k)!r} != {b['headers'].get(k)!r}")
    body_a = {k for k in ("sse", "json", "text") if k in a}
    body_b = {k for k in ("sse", "json", "text") if k in b}
    if body_a != body_b:
        return [*out, f"body kind {body_a} != {body_b}"]
    if "json" in a:
        out += _path_diffs(a["json"], b["json"], "body")
    elif "text" in a and text and a["text"] != b["text"]:
        out.append(f"body {a['text']!r} != {b['text']!r}")
    elif "sse" in a:
        sa, sb = a["sse"], b["sse"]
        for k in ("prefix", "suffix", "last", "kinds"):
            if sa[k] != sb[k]:
                out.append(f"sse {k}: {sa[k]!r} != {sb[k]!r}")
        for kind in _distinct([*sa["chunks"], *sb["chunks"]]):
            ca, cb = sa["chunks"].get(kind, []), sb["chunks"].get(kind, [])
            if ca == cb:
                continue
            if len(ca) == len(cb) == 1:
                out += _path_diffs(ca[0], cb[0], f"sse {kind} chunk")
            else:
                out.append(f"sse {kind} chunks: {json.dumps(ca)} != {json.dumps(cb)}")
    return out


# -- /metrics ----------------------------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


@dataclass
class MetricFamily:
    name: str
    type: str
    samples: dict[str, list[str]] = field(default_factory=dict)  # sample -> label names, in order


def metric_families(text: str) -> dict[str, MetricFamily]:
    """Prometheus text's families: type, and each sample name with its label names in order."""
    families: dict[str, MetricFamily] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(maxsplit=3)
            families[name] = MetricFamily(name, kind)
            continue
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        name = m.group(1)
        family = next(
            (families[f] for f in _family_names(name) if f in families),
            None,
        )
        if family is None:
            family = families.setdefault(name, MetricFamily(name, "untyped"))
        family.samples.setdefault(name, _LABEL.findall(m.group(3) or ""))
    return families


def _family_names(sample: str) -> list[str]:
    names = [sample]
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_info"):
        if sample.endswith(suffix):
            names.append(sample.removesuffix(suffix))
    return names
