"""``python -m simulator`` is ``shadow-ab sim``."""

from simulator.cli import sim

sim(prog_name="shadow-ab sim")
