"""The serving process the supervisor starts (``python -m simulator.child``).

Reads its settings from the ``SHADOW_AB_SIM_CHILD`` environment variable (JSON written by
:mod:`simulator.supervisor`), serves until SIGTERM/SIGINT (exit 0), or until an injected crash
(exit :data:`CRASH_EXIT_CODE` after writing ``crash.json`` for the supervisor). A port that
cannot be bound exits with :data:`BIND_EXIT_CODE`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from simulator.clock import SimClock
from simulator.ledger import Ledger
from simulator.scenario import Scenario
from simulator.server import SimServer

ENV_VAR = "SHADOW_AB_SIM_CHILD"
CRASH_EXIT_CODE = 86
BIND_EXIT_CODE = 87
CRASH_FILE = "crash.json"
EPOCH_FILE = "epoch.json"


def _crash(state_dir: Path, ledger: Ledger) -> Any:
    def handler(at_elapsed: float, restart_delay_s: float, streak: int) -> None:
        (state_dir / CRASH_FILE).write_text(
            json.dumps(
                {"at_elapsed": at_elapsed, "restart_delay_s": restart_delay_s, "streak": streak}
            )
        )
        ledger.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(CRASH_EXIT_CODE)

    return handler


async def serve(settings: dict[str, Any]) -> int:
    scenario = Scenario.model_validate(settings["scenario"])
    state_dir = Path(settings["state_dir"])
    epoch = settings.get("epoch")
    if epoch is None:  # the first process: the timeline starts now
        epoch = time.time()
        (state_dir / EPOCH_FILE).write_text(json.dumps({"epoch": epoch}))
    clock = SimClock(float(epoch), scenario.time_scale)
    ledger_path = settings.get("ledger")
    ledger = Ledger(
        Path(ledger_path) if ledger_path else None,
        clock,
        flavor=scenario.flavor,
        engine=settings.get("engine") or f"{scenario.flavor}@{settings['port']}",
    )
    start_wall, start_elapsed = time.time(), clock.elapsed()
    server = SimServer(
        scenario,
        clock,
        ledger,
        process_start_wall=start_wall,
        process_start_elapsed=start_elapsed,
        resume_after=settings.get("resume_after"),
        restarts=int(settings.get("restarts", 0)),
        crash_streak=int(settings.get("crash_streak", 0)),
        on_crash=_crash(state_dir, ledger),
    )
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings["host"], settings["port"], reuse_address=True)
    try:
        await site.start()
    except OSError as exc:
        print(
            f"shadow-ab sim: cannot listen on {settings['host']}:{settings['port']}: {exc};"
            " pick a free port",
            file=sys.stderr,
        )
        await runner.cleanup()
        return BIND_EXIT_CODE
    ledger.write(
        "start",
        scenario=scenario.name,
        version=server.faults.version,
        process_start_time=start_wall,
        restarts=int(settings.get("restarts", 0)),
        host=settings["host"],
        port=settings["port"],
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    ledger.write("stop")
    ledger.close()
    return 0


def main() -> None:
    raw = os.environ.get(ENV_VAR)
    if not raw:
        sys.exit(f"{ENV_VAR} is not set: start the simulator with `shadow-ab sim`, not directly")
    settings = json.loads(raw)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is optional
        rc = asyncio.run(serve(settings))
    else:
        rc = uvloop.run(serve(settings))
    sys.exit(rc)


if __name__ == "__main__":
    main()
