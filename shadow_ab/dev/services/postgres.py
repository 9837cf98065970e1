"""A private PostgreSQL cluster from Debian's packages, on loopback, under ``var/services``.

The cluster has its own data directory and socket folder, a superuser ``shadow`` with trust
authentication on 127.0.0.1 only (a development server), and a database ``shadow_ab``.
PostgreSQL refuses to run as root, so as root the server runs as the ``postgres`` system user
that Debian's package creates.
"""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path

from shadow_ab.dev.services.base import (
    LOOPBACK,
    PortTakenError,
    ServiceError,
    ServicesSettings,
    ServiceStatus,
    apt_install,
    port_open,
    run,
    wait_until,
)

USER = "shadow"
DATABASE = "shadow_ab"


def _bin_dir() -> Path | None:
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


class LocalPostgres:
    name = "postgres"

    def __init__(self, settings: ServicesSettings) -> None:
        self.port = settings.pg_port
        self.home = settings.root / "postgres"
        self.data = self.home / "data"
        self.sockets = self.home / "run"
        self.log = self.home / "postgres.log"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{USER}@{LOOPBACK}:{self.port}/{DATABASE}"

    # -- install -----------------------------------------------------------------------------

    def _bins(self) -> Path:
        bins = _bin_dir()
        if bins is None:
            apt_install("postgresql", "postgresql-contrib")
            bins = _bin_dir()
        if bins is None:
            raise ServiceError("PostgreSQL installed but no /usr/lib/postgresql/*/bin/pg_ctl found")
        return bins

    def _as_owner(self, cmd: list[str]) -> list[str]:
        if os.geteuid() != 0:
            return cmd
        return ["runuser", "-u", "postgres", "--", *cmd]

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            for p in [path, *path.rglob("*")]:
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def _init(self, bins: Path) -> None:
        if (self.data / "PG_VERSION").exists():
            return
        self.home.mkdir(parents=True, exist_ok=True)
        self.sockets.mkdir(exist_ok=True)
        if self.data.exists():
            shutil.rmtree(self.data)  # a half-made cluster from an interrupted first start
        self.data.mkdir(mode=0o700)
        self._chown(self.home)
        # The owner must be able to reach the folder: open the path's parents for traversal.
        for parent in self.home.parents:
            if parent == Path("/"):
                break
            mode = parent.stat().st_mode
            if not mode & 0o001:
                os.chmod(parent, mode | 0o001)
        run(
            self._as_owner(
                [
                    str(bins / "initdb"),
                    "-D",
                    str(self.data),
                    "-U",
                    USER,
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                ]
            ),
            "initdb",
        )
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "\n# shadow-ab local development server\n"
                f"listen_addresses = '{LOOPBACK}'\n"
                f"port = {self.port}\n"
                f"unix_socket_directories = '{self.sockets}'\n"
                "max_connections = 200\n"
                "shared_buffers = 256MB\n"
                "max_wal_size = 2GB\n"
                "max_locks_per_transaction = 256\n"
            )

    # -- lifecycle ---------------------------------------------------------------------------

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists() and port_open(self.port)

    def up(self) -> None:
        if self.running():
            return
        if port_open(self.port):
            raise PortTakenError(
                f"port {self.port} is taken by another process; stop it or pick another port"
                " with SHADOW_AB_PG_PORT=<port>"
            )
        bins = self._bins()
        self._init(bins)
        run(
            self._as_owner(
                [
                    str(bins / "pg_ctl"),
                    "-D",
                    str(self.data),
                    "-l",
                    str(self.log),
                    "-o",
                    f"-p {self.port}",
                    "-w",
                    "-t",
                    "60",
                    "start",
                ]
            ),
            "starting PostgreSQL",
            timeout_s=90,
        )
        wait_until(
            lambda: port_open(self.port),
            30,
            "PostgreSQL",
            f"see {self.log}",
        )
        self._create_database(bins)

    def _create_database(self, bins: Path) -> None:
        server = ["-h", LOOPBACK, "-p", str(self.port), "-U", USER]
        exists = run(
            [
                str(bins / "psql"),
                *server,
                "-d",
                "postgres",
                "-tAc",
                f"SELECT 1 FROM pg_database WHERE datname = '{DATABASE}'",
            ],
            f"checking for the {DATABASE} database",
        )
        if exists.strip() != "1":
            run([str(bins / "createdb"), *server, DATABASE], f"creating the {DATABASE} database")

    def down(self) -> None:
        bins = _bin_dir()
        if bins is None or not (self.data / "postmaster.pid").exists():
            return
        run(
            self._as_owner(
                [str(bins / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop"]
            ),
            "stopping PostgreSQL",
            timeout_s=90,
        )

    def status(self) -> ServiceStatus:
        up = self.running()
        detail = self.url if up else ("stopped" if self.data.exists() else "not installed")
        return ServiceStatus(self.name, up, f"{LOOPBACK}:{self.port}", detail)

    def env(self) -> dict[str, str]:
        return {"SHADOW_AB_DATABASE_URL": self.url}
