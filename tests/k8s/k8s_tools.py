"""kustomize, kubeconform and promqlcheck for the k8s tests: pinned, built from the Go module
proxy once per machine into ``var/tools/bin`` (about 20 s with a warm Go cache, 2-3 min cold),
then reused. promqlcheck is our own few lines (``tests/k8s/promqlcheck``) around Prometheus's
PromQL parser, with its dependencies pinned by its go.sum.

Also renders overlays and validates them offline against the JSON schemas in ``k8s/schemas``.

Errors: :class:`ToolError` (Go missing, the proxy unreachable, a build failing) with a sentence
saying what to do.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "k8s"
SCHEMAS = K8S / "schemas"
TOOLS_BIN = REPO / "var" / "tools" / "bin"
SCHEMA_LOCATION = str(SCHEMAS) + "/{{ .ResourceKind }}{{ .KindSuffix }}.json"
PROMQLCHECK_SRC = Path(__file__).resolve().parent / "promqlcheck"

# name -> Go package@version (kustomize v5.8.3 and later need Go 1.27; this machine has 1.26)
PINS = {
    "kustomize": "sigs.k8s.io/kustomize/kustomize/v5@v5.8.1",
    "kubeconform": "github.com/yannh/kubeconform/cmd/kubeconform@v0.8.0",
}


class ToolError(RuntimeError):
    """A tool could not be installed or run."""


@dataclass(frozen=True)
class Tools:
    kustomize: Path
    kubeconform: Path
    promqlcheck: Path


def _marker(name: str) -> Path:
    return TOOLS_BIN / f".{name}.version"


def _promqlcheck_pin() -> str:
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum", "main.go"):
        digest.update((PROMQLCHECK_SRC / name).read_bytes())
    return digest.hexdigest()


def _installed(name: str, pin: str) -> bool:
    marker = _marker(name)
    return (TOOLS_BIN / name).exists() and marker.exists() and marker.read_text() == pin


def _go() -> str:
    go = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if Path(p).exists()), None
    )
    if go is None:
        raise ToolError(
            f"the k8s test tools are not in {TOOLS_BIN} and Go is not installed: install Go"
            f" (1.26+), or put kustomize and kubeconform ({', '.join(PINS.values())}) there by"
            " hand"
        )
    return go


def _run_go(args: list[str], cwd: Path, what: str) -> None:
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(TOOLS_BIN), "GOFLAGS": "-buildvcs=false"}
    proc = subprocess.run(
        [_go(), *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolError(
            f"`go {' '.join(args)}` ({what}) failed; is the Go module proxy reachable? GOPROXY="
            f"{os.environ.get('GOPROXY', 'default')}\n{proc.stderr[-2000:]}"
        )


def ensure_tools() -> Tools:
    """The pinned tools, installed first if absent or at another version."""
    for name, pin in PINS.items():
        if not _installed(name, pin):
            _run_go(["install", pin], TOOLS_BIN.parent, name)
            _marker(name).write_text(pin)
    pin = _promqlcheck_pin()
    if not _installed("promqlcheck", pin):
        out = TOOLS_BIN / "promqlcheck"
        _run_go(["build", "-o", str(out), "."], PROMQLCHECK_SRC, "promqlcheck")
        _marker("promqlcheck").write_text(pin)
    return Tools(
        kustomize=TOOLS_BIN / "kustomize",
        kubeconform=TOOLS_BIN / "kubeconform",
        promqlcheck=TOOLS_BIN / "promqlcheck",
    )


def build(tools: Tools, path: Path) -> str:
    """``kustomize build path`` as YAML text."""
    proc = subprocess.run(
        [str(tools.kustomize), "build", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolError(f"kustomize build {path} failed:\n{proc.stderr}")
    return proc.stdout


def validate(tools: Tools, rendered: str) -> subprocess.CompletedProcess[str]:
    """Run kubeconform (strict, offline, every kind must have a schema) on YAML from stdin."""
    return subprocess.run(
        [
            str(tools.kubeconform),
            "-strict",
            "-summary",
            "-output",
            "text",
            "-schema-location",
            SCHEMA_LOCATION,
            "-",
        ],
        input=rendered,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def promql_errors(tools: Tools, exprs: list[str]) -> str:
    """Parse each expression with Prometheus's parser; the report of those that fail ("" if
    none)."""
    lines = [" ".join(e.split()) for e in exprs]  # one line each (YAML folds keep newlines)
    proc = subprocess.run(
        [str(tools.promqlcheck)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if proc.returncode not in (0, 1):
        raise ToolError(f"promqlcheck failed: {proc.stderr}")
    return proc.stdout


def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise KeyError(f"no {kind} {name} in the rendered overlay")
