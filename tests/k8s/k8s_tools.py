"""kustomize and kubeconform for the k8s tests: pinned, built from the Go module proxy once per
machine into ``var/tools/bin`` (about 20 s with a warm Go cache, 1-2 min cold), then reused.

Also renders overlays and validates them offline against the JSON schemas in ``k8s/schemas``.

Errors: :class:`ToolError` (Go missing, the proxy unreachable, a build failing) with a sentence
saying what to do.
"""

from __future__ import annotations

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


def _marker(name: str) -> Path:
    return TOOLS_BIN / f".{name}.version"


def _installed(name: str) -> bool:
    marker = _marker(name)
    return (TOOLS_BIN / name).exists() and marker.exists() and marker.read_text() == PINS[name]


def _go_install(name: str) -> None:
    go = shutil.which("go")
    if go is None:
        raise ToolError(
            f"{name} is not in {TOOLS_BIN} and Go is not installed: install Go (1.26+) or put"
            f" {name} ({PINS[name]}) in {TOOLS_BIN} by hand"
        )
    TOOLS_BIN.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GOBIN": str(TOOLS_BIN), "GOFLAGS": "-buildvcs=false"}
    proc = subprocess.run(
        [go, "install", PINS[name]],
        env=env,
        cwd=TOOLS_BIN,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode != 0:
        raise ToolError(
            f"`go install {PINS[name]}` failed (is the Go module proxy reachable? GOPROXY="
            f"{os.environ.get('GOPROXY', 'default')}):\n{proc.stderr[-2000:]}"
        )
    _marker(name).write_text(PINS[name])


def ensure_tools() -> Tools:
    """The pinned tools, installed first if absent or at another version."""
    for name in PINS:
        if not _installed(name):
            _go_install(name)
    return Tools(kustomize=TOOLS_BIN / "kustomize", kubeconform=TOOLS_BIN / "kubeconform")


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


def objects(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for doc in docs:
        if doc["kind"] == kind and doc["metadata"]["name"] == name:
            return doc
    raise KeyError(f"no {kind} {name} in the rendered overlay")
