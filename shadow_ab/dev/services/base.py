"""What the local services have in common: settings, errors, ports, processes, installs.

Errors::

    ServiceError            a local service could not be installed, started or stopped
    └── PortTakenError      something else already listens on the service's port
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from shadow_ab.settings import state_dir

LOOPBACK = "127.0.0.1"


class ServiceError(RuntimeError):
    """A local service could not be installed, started or stopped; the message says why."""


class PortTakenError(ServiceError):
    pass


class ServicesSettings(BaseSettings):
    """Ports and places of the local development services."""

    model_config = SettingsConfigDict(env_prefix="SHADOW_AB_", extra="ignore")

    pg_port: int = Field(default=55432, ge=1024, le=65535)
    kafka_port: int = Field(default=59092, ge=1024, le=65535)
    kafka_controller_port: int = Field(default=59093, ge=1024, le=65535)
    kafka_heap: str = Field(default="768m", pattern=r"^\d+[mg]$")
    root: Path = Field(default_factory=lambda: state_dir() / "services")


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    address: str
    detail: str


def port_open(port: int, host: str = LOOPBACK, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(check: Callable[[], bool], timeout_s: float, what: str, hint: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.25)
    raise ServiceError(f"{what} did not come up within {timeout_s:.0f} s; {hint}")


def pid_alive(pid_file: Path) -> int | None:
    """The pid recorded in ``pid_file`` if that process is alive, else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    # A zombie child of ours counts as dead.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return None
    return None if state == "Z" else pid


def run(
    cmd: Sequence[str], what: str, timeout_s: float = 600, env: dict[str, str] | None = None
) -> str:
    """Run an install/admin step; on failure raise ServiceError with its output's tail."""
    try:
        proc = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=env,
        )
    except FileNotFoundError as exc:
        raise ServiceError(f"{what} failed: {cmd[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise ServiceError(f"{what} timed out after {timeout_s:.0f} s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise ServiceError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tail}")
    return proc.stdout


_apt_updated = False


def apt_install(*packages: str) -> None:
    """Install Debian packages (root only), running ``apt-get update`` once first."""
    global _apt_updated
    if os.geteuid() != 0:
        raise ServiceError(
            f"{', '.join(packages)} missing and this is not root: "
            f"install them with `sudo apt-get install {' '.join(packages)}`"
        )
    if shutil.which("apt-get") is None:
        raise ServiceError(f"{', '.join(packages)} missing and apt-get is not available")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    if not _apt_updated:
        run(["apt-get", "update", "-q"], "apt-get update", env=env)
        _apt_updated = True
    run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages],
        f"installing {' '.join(packages)}",
        env=env,
    )
