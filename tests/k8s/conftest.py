"""Fixtures of the k8s tests: the pinned tools and each overlay rendered once per session."""

from __future__ import annotations

from typing import Any

import pytest
from k8s_tools import K8S, ToolError, Tools, build, ensure_tools, objects


@pytest.fixture(scope="session")
def tools() -> Tools:
    try:
        return ensure_tools()
    except ToolError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def rendered(tools: Tools) -> dict[str, str]:
    """Overlay name -> the YAML `kustomize build` renders for it."""
    return {name: build(tools, K8S / "overlays" / name) for name in ("dev", "prod")}


@pytest.fixture(scope="session")
def docs(rendered: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    return {name: objects(text) for name, text in rendered.items()}
