"""trtllm-serve's own HTTP layer on a CPU, with a stub generator, to record its wire format.

TensorRT-LLM needs an NVIDIA GPU to generate, but its OpenAI-compatible server
(``tensorrt_llm/serve/openai_server.py`` with ``openai_protocol.py``,
``postprocess_handlers.py``, ``chat_utils.py``, ``metrics/``, ``version.py``) is plain
FastAPI and pydantic. :mod:`shadow_ab.dev.engines.trtllm_stub` replaces what those files import
from the GPU side (the executor, torch, xgrammar, the C++ bindings) with stubs and gives the
server a stub LLM, so the real FastAPI app, pydantic models and SSE post-processing produce
their real bytes. :data:`BATTERY` is asked of it and the answers written as fixtures, with
:func:`shadow_ab.dev.engines.fixtures.to_fixture` (ids, ``created``, the date normalised).

Nothing of TensorRT-LLM is in this repository: ``--source DIR`` names a TensorRT-LLM source
checkout (the public repository NVIDIA/TensorRT-LLM at a commit) or an unpacked wheel, i.e. a
folder holding ``tensorrt_llm/serve/openai_server.py``. Everything else lives under var/::

    var/trtllm-serve/venv/    fastapi, uvicorn, pydantic, openai, ... (:data:`PINS`); no torch
    var/trtllm-serve/model/TinyLlama-stub/config.json   the model folder (a config only)
    var/trtllm-serve/server.log

What is stubbed is not recorded: tokenization, detokenization, stop strings and the
``finish_reason``/``stop_reason`` logic (``executor/result.py``), timing. See
``tests/fixtures/trtllm-<version>/README.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shadow_ab.dev.engines import fixtures
from shadow_ab.dev.engines.fixtures import Case
from shadow_ab.dev.processes import free_port, http_get
from shadow_ab.settings import state_dir

PINS = (
    "fastapi==0.115.4",
    "starlette==0.41.3",
    "uvicorn==0.55.0",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "openai==3.60.0",
    "openai-harmony==0.0.8",
    "transformers==5.25.0",
    "tokenizers==0.23.3",
    "huggingface-hub==2.4.0",
    "prometheus-client==0.26.0",
    "prometheus-fastapi-instrumentator==7.1.0",
)
"""The server's Python dependencies, as recorded (pydantic's error text depends on them)."""

SOURCE_FILES = (
    "serve/openai_server.py",
    "serve/openai_protocol.py",
    "serve/postprocess_handlers.py",
    "serve/chat_utils.py",
    "metrics/collector.py",
    "metrics/enums.py",
    "version.py",
)
"""The files under ``tensorrt_llm/`` the server runs; the rest of the package is stubbed."""

MODEL = "TinyLlama-stub"
MODEL_CONFIG = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
"""The model folder holds this config.json only (the server reads the model type from it)."""

STUB_DIR = Path(__file__).resolve().parent / "trtllm_stub"


class TrtllmUnavailable(RuntimeError):
    """The source tree or the venv is not usable."""


# -- the source -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceFile:
    path: str  # under tensorrt_llm/
    size: int
    sha256: str


def source_files(source: Path) -> list[SourceFile]:
    """The files the server runs from ``source`` (a folder holding ``tensorrt_llm/``), with their
    sizes and digests; raises :class:`TrtllmUnavailable` when one is missing."""
    out = []
    for rel in SOURCE_FILES:
        path = source / "tensorrt_llm" / rel
        if not path.is_file():
            raise TrtllmUnavailable(
                f"{path} is missing: --source must name a TensorRT-LLM checkout or unpacked wheel "
                "(a folder holding tensorrt_llm/serve/openai_server.py)"
            )
        data = path.read_bytes()
        out.append(SourceFile(rel, len(data), hashlib.sha256(data).hexdigest()))
    return out


def source_version(source: Path) -> str:
    """``__version__`` from ``tensorrt_llm/version.py`` (read, not imported)."""
    for line in (source / "tensorrt_llm" / "version.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    raise TrtllmUnavailable("no __version__ in tensorrt_llm/version.py")


# -- the venv and the server ------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def model(self) -> Path:
        return self.root / "model" / MODEL

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def pins_file(self) -> Path:
        return self.venv / "shadow-ab-pins.json"


def layout(home: Path | None = None) -> Layout:
    return Layout((home or state_dir()) / "trtllm-serve")


def venv_ready(lay: Layout) -> bool:
    try:
        return json.loads(lay.pins_file.read_text()) == list(PINS)
    except (OSError, ValueError):
        return False


def prepare(lay: Layout, log: Callable[[str], None] = print) -> None:
    """Make the venv (kept when its pins match) and the model folder."""
    lay.model.mkdir(parents=True, exist_ok=True)
    (lay.model / "config.json").write_text(json.dumps(MODEL_CONFIG))
    if venv_ready(lay):
        return
    log(f"making {lay.venv} (about 360 MB, no torch)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(lay.venv)], check=True)
    pip = [str(lay.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    result = subprocess.run([*pip, *PINS], capture_output=True, text=True)
    if result.returncode != 0:
        raise TrtllmUnavailable(f"pip install failed:\n{result.stderr[-3000:]}")
    lay.pins_file.write_text(json.dumps(list(PINS)))


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base_url: str
    log: Path


@contextmanager
def running_server(lay: Layout, source: Path, timeout: float = 120.0) -> Iterator[Server]:
    """trtllm-serve's OpenAIServer from ``source`` on 127.0.0.1 (a free port) until the block
    ends."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["TRTLLM_SOURCE"] = str(source.resolve())
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    cmd = [str(lay.python), str(STUB_DIR / "run_server.py"), str(port), str(lay.model)]
    with lay.log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    server = Server(proc, f"http://127.0.0.1:{port}", lay.log)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                tail = lay.log.read_text(errors="replace")[-3000:]
                raise TrtllmUnavailable(f"the server exited with {proc.returncode}:\n{tail}")
            try:
                if http_get(server.base_url + "/health", timeout=2.0)[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TrtllmUnavailable(f"the server did not answer /health in {timeout:.0f}s")
            time.sleep(0.3)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the battery ------------------------------------------------------------------------------

_MESSAGES = [{"role": "user", "content": "Say hello."}]
CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
USAGE = {"include_usage": True}
NOT_CONTINUOUS = {"include_usage": True, "continuous_usage_stats": False}


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": _MESSAGES, "max_tokens": 4, **extra}


def _cmpl(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "prompt": "Say hello.", "max_tokens": 4, **extra}


def _post(name: str, path: str, body: dict[str, Any] | str) -> Case:
    return Case(name, "POST", path, body)


def _without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}


BATTERY: tuple[Case, ...] = (
    # chat
    _post("chat", CHAT, _chat()),
    _post("chat-stream", CHAT, _chat(stream=True)),
    _post("chat-stream-usage", CHAT, _chat(stream=True, stream_options=USAGE)),
    _post(
        "chat-stream-usage-no-continuous", CHAT, _chat(stream=True, stream_options=NOT_CONTINUOUS)
    ),
    _post("chat-logprobs", CHAT, _chat(logprobs=True)),
    _post("chat-logprobs-top", CHAT, _chat(logprobs=True, top_logprobs=2)),
    _post("chat-stream-logprobs", CHAT, _chat(stream=True, logprobs=True, top_logprobs=2)),
    _post("chat-stop", CHAT, _chat(stop=[" world"])),
    _post("chat-stream-stop", CHAT, _chat(stream=True, stop=[" world"])),
    _post("chat-unknown-model", CHAT, _chat(model="no-such-model")),
    _post("chat-400-n2", CHAT, _chat(n=2)),
    _post("chat-400-unknown-field", CHAT, _chat(bogus_field=1)),
    _post("chat-400-wrong-type", CHAT, _chat(max_tokens="many")),
    _post("chat-400-missing-messages", CHAT, _without(_chat(), "messages")),
    _post("chat-400-stream-options-without-stream", CHAT, _chat(stream_options=USAGE)),
    _post("chat-400-top-logprobs-without-logprobs", CHAT, _chat(top_logprobs=2)),
    _post("chat-400-bad-json", CHAT, '{"model": "TinyLlama-stub", "messages": ['),
    # completions
    _post("cmpl", CMPL, _cmpl()),
    _post("cmpl-stream", CMPL, _cmpl(stream=True)),
    _post("cmpl-stream-usage", CMPL, _cmpl(stream=True, stream_options=USAGE)),
    _post(
        "cmpl-stream-usage-no-continuous", CMPL, _cmpl(stream=True, stream_options=NOT_CONTINUOUS)
    ),
    _post("cmpl-stop", CMPL, _cmpl(stop=[" world"])),
    _post("cmpl-stream-stop", CMPL, _cmpl(stream=True, stop=[" world"])),
    _post("cmpl-unknown-model", CMPL, _cmpl(model="no-such-model")),
    _post("cmpl-400-logprobs", CMPL, _cmpl(logprobs=1)),
    _post("cmpl-400-n2", CMPL, _cmpl(n=2)),
    _post("cmpl-400-unknown-field", CMPL, _cmpl(bogus_field=1)),
    _post("cmpl-400-missing-prompt", CMPL, _without(_cmpl(), "prompt")),
    _post("cmpl-400-suffix", CMPL, _cmpl(suffix="!")),
    _post("cmpl-400-stream-options-without-stream", CMPL, _cmpl(stream_options=USAGE)),
    _post("cmpl-400-bad-json", CMPL, "{not json"),
    # the rest of the routes
    _post("responses-400-not-harmony", "/v1/responses", {"model": MODEL, "input": "hi"}),
    Case("unknown-route-404", "GET", "/v1/nope"),
    Case("health", "GET", "/health"),
    Case("health-generate", "GET", "/health_generate"),
    Case("version", "GET", "/version"),
    Case("models", "GET", "/v1/models"),
    Case("perf-metrics", "GET", "/perf_metrics"),
    Case("metrics", "GET", "/metrics"),
    Case("prometheus-metrics", "GET", "/prometheus/metrics"),
)
"""Asked in this order (``/metrics`` and ``/prometheus/metrics`` last, after the traffic)."""


def normalise_prometheus(text: str) -> str:
    """Prometheus text with each sample's value as ``<v>`` (they hold timings); names, label sets,
    ``# HELP``/``# TYPE`` lines kept."""
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            line = line.rsplit(" ", 1)[0] + " <v>"
        out.append(line)
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _numbered_ids(answer: fixtures.Answer) -> list[str]:
    """Each body's or chunk's ``id`` in order, as ``<prefix>-<k>``: ``k`` counts distinct ids in
    this answer, so the fixture keeps the prefix and whether chunks share an id."""
    if (answer.header("content-type") or "").startswith("text/event-stream"):
        frames = [f.removeprefix("data: ") for f in fixtures.sse_frames(answer.raw)]
        objs = [json.loads(f) for f in frames if f.startswith("{")]
    else:
        objs = [json.loads(answer.raw)]
    seen: dict[str, str] = {}
    out = []
    for obj in objs:
        raw = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(raw, str) and raw.startswith(("chatcmpl-", "cmpl-")):
            seen.setdefault(raw, f"{raw.split('-', 1)[0]}-<{len(seen) + 1}>")
            out.append(seen[raw])
    return out


def to_fixture(case: Case, answer: fixtures.Answer) -> dict[str, Any]:
    out = fixtures.to_fixture(case, answer)
    if case.name == "prometheus-metrics" and "text" in out:
        out["text"] = normalise_prometheus(out["text"])
    if answer.status == 200 and case.path in (CHAT, CMPL):
        ids = iter(_numbered_ids(answer))
        if "sse" in out:
            out["sse"] = [
                f.replace('"id":"<id>"', f'"id":"{next(ids)}"', 1) if f.startswith("data: {") else f
                for f in out["sse"]
            ]
        elif "json" in out:
            out["json"]["id"] = next(ids)
    return out


def record(
    base_url: str, out: Path, *, meta: dict[str, Any], log: Callable[[str], None] = print
) -> list[Path]:
    """Ask ``base_url`` :data:`BATTERY`; write ``<case>.json`` per case and ``meta.json``."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for case in BATTERY:
        answer = fixtures.ask(base_url, case, timeout=60.0)
        path = out / f"{case.name}.json"
        path.write_text(json.dumps(to_fixture(case, answer), indent=1, ensure_ascii=False) + "\n")
        log(f"{case.name}: {answer.status}, {len(answer.raw)} bytes")
        written.append(path)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return [*written, out / "meta.json"]


def meta_for(source: Path) -> dict[str, Any]:
    return {
        "engine": "trtllm-serve (OpenAIServer on CPU, stub generator)",
        "version": source_version(source),
        "model": MODEL,
        "source_files": {
            f"tensorrt_llm/{f.path}": {"bytes": f.size, "sha256": f.sha256}
            for f in source_files(source)
        },
        "pins": list(PINS),
        "recorded_by": "shadow-ab engine trtllm record --source DIR",
    }
