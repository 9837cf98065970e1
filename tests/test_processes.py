"""The process launcher (shadow_ab/dev/processes.py): a process group of its own is stopped,
killed and started again as a whole (real vLLM's API server with its engine core and worker)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from shadow_ab.dev.processes import ManagedProcess, ProcessError, free_port_run

# A leader that starts a child which outlives it (like vLLM's worker), and ignores SIGTERM
# when asked to.
FAMILY = """
import os, signal, subprocess, sys, time
if sys.argv[1:] == ["stubborn"]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                         start_new_session=False)
print(child.pid, flush=True)
time.sleep(300)
"""


def family(tmp_path: Path, *args: str, new_session: bool = True) -> tuple[ManagedProcess, int]:
    proc = ManagedProcess(
        [sys.executable, "-c", FAMILY, *args],
        tmp_path / "family.log",
        merge_stdout=True,
        new_session=new_session,
    )
    proc.wait_until(lambda: proc.log_path.read_text().strip() != "", "started", 30)
    return proc, int(proc.log_path.read_text().split()[-1])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent) is gone as far as we are concerned
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def test_stop_takes_the_leaders_children_with_it(tmp_path: Path) -> None:
    proc, child = family(tmp_path)
    assert os.getpgid(child) == proc.pid  # the group the leader leads
    assert proc.stop() == -signal.SIGTERM
    assert gone(child)


def test_kill_is_a_crash_of_the_whole_group_and_relaunch_starts_it_again(
    tmp_path: Path,
) -> None:
    proc, child = family(tmp_path)
    first = proc.pid
    with pytest.raises(ProcessError, match="still running"):
        proc.relaunch()
    assert proc.kill() == -signal.SIGKILL
    assert gone(child)
    proc.relaunch()
    try:
        proc.wait_until(lambda: len(proc.log_path.read_text().split()) == 2, "started", 30)
        second_child = int(proc.log_path.read_text().split()[-1])
        assert proc.pid != first and alive(second_child)
        assert str(child) in proc.log_path.read_text()  # the log was appended to, not replaced
    finally:
        proc.stop()
    assert gone(second_child)


def test_a_group_that_ignores_sigterm_is_killed_and_the_error_says_so(tmp_path: Path) -> None:
    proc, child = family(tmp_path, "stubborn")
    with pytest.raises(ProcessError, match="ignored SIGTERM"):
        proc.stop(timeout=0.5)
    assert gone(child) and proc.process.poll() == -signal.SIGKILL


def test_without_a_group_of_its_own_only_the_process_is_stopped(tmp_path: Path) -> None:
    proc, child = family(tmp_path, new_session=False)
    try:
        assert os.getpgid(child) == os.getpgid(0)  # our own group: not the launcher's to kill
        proc.stop()
        assert alive(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_free_port_run_is_bindable_whole_and_below_the_ephemeral_range() -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_low = int(f.read().split()[0])
    for _ in range(5):
        base = free_port_run(3)
        assert base >= 10_000 and base + 3 <= ephemeral_low
        held = []
        try:
            for port in range(base, base + 3):  # every port of the run binds
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind(("127.0.0.1", port))
        finally:
            for s in held:
                s.close()
