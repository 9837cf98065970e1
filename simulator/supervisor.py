"""``shadow-ab sim`` itself: a small supervisor that restarts the serving process.

Like Kubernetes restarting a crashed pod: when the child exits with the injected-crash code, the
supervisor waits the fault's restart delay (simulated seconds, so divided by the time scale),
appends a ``restart`` line to the ledger and starts a new child on the same port (a new pid and
process start time). Any other exit of the child ends the supervisor with the same code; SIGTERM
or SIGINT stops the child and exits 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from simulator.child import CRASH_EXIT_CODE, CRASH_FILE, ENV_VAR, EPOCH_FILE
from simulator.clock import SimClock
from simulator.ledger import Ledger
from simulator.scenario import Scenario


class Supervisor:
    def __init__(
        self,
        scenario: Scenario,
        *,
        host: str,
        port: int,
        ledger: Path | None,
        engine: str | None = None,
    ) -> None:
        self.scenario = scenario
        self.host = host
        self.port = port
        self.ledger_path = ledger
        self.engine = engine or f"{scenario.flavor}@{host}:{port}"
        self.epoch: float | None = None  # set by the first serving process
        self._stop = threading.Event()
        self._child: subprocess.Popen[bytes] | None = None

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)

    def _spawn(
        self, state_dir: str, resume_after: float | None, restarts: int, streak: int
    ) -> subprocess.Popen[bytes]:
        settings = {
            "scenario": self.scenario.model_dump(mode="json"),
            "epoch": self.epoch,
            "host": self.host,
            "port": self.port,
            "ledger": str(self.ledger_path) if self.ledger_path else None,
            "engine": self.engine,
            "state_dir": state_dir,
            "resume_after": resume_after,
            "restarts": restarts,
            "crash_streak": streak,
        }
        env = {**os.environ, ENV_VAR: json.dumps(settings)}
        return subprocess.Popen([sys.executable, "-m", "simulator.child"], env=env)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        sc = self.scenario
        marker = f" (TIME ACCELERATED x{sc.time_scale:g})" if sc.accelerated else ""
        print(
            f"shadow-ab sim: {sc.flavor} '{sc.name}' model {sc.model} on"
            f" http://{self.host}:{self.port}{marker}; ledger {self.ledger_path or 'off'}",
            file=sys.stderr,
            flush=True,
        )
        ledger: Ledger | None = None
        resume_after: float | None = None
        restarts = streak = 0
        with tempfile.TemporaryDirectory(prefix="shadow-ab-sim-") as state_dir:
            try:
                while not self._stop.is_set():
                    self._child = self._spawn(state_dir, resume_after, restarts, streak)
                    rc = self._child.wait()
                    if self._stop.is_set():
                        return 0
                    if rc != CRASH_EXIT_CODE:
                        print(f"shadow-ab sim: serving process exited with {rc}", file=sys.stderr)
                        return rc if rc > 0 else 1
                    if ledger is None:
                        self.epoch = json.loads((Path(state_dir) / EPOCH_FILE).read_text())["epoch"]
                        clock = SimClock(float(self.epoch), sc.time_scale)
                        ledger = Ledger(
                            self.ledger_path, clock, flavor=sc.flavor, engine=self.engine
                        )
                    crash_file = Path(state_dir) / CRASH_FILE
                    crash = json.loads(crash_file.read_text())
                    crash_file.unlink()
                    delay = float(crash["restart_delay_s"])
                    resume_after = float(crash["at_elapsed"])
                    streak = int(crash.get("streak", 0))
                    if self._stop.wait(clock.real_seconds(delay)):
                        return 0
                    restarts += 1
                    ledger.write(
                        "restart",
                        restarts=restarts,
                        crashed_pid=self._child.pid,
                        down_from=clock.at(float(crash["at_elapsed"])),
                        restart_delay_s=delay,
                    )
                return 0
            finally:
                child = self._child
                if child is not None and child.poll() is None:
                    child.terminate()
                    try:
                        child.wait(10)
                    except subprocess.TimeoutExpired:
                        child.kill()
                        child.wait()
                if ledger is not None:
                    ledger.close()
