"""``shadow-ab api``: the server starts from settings and serves; the role command works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
from api_seed import DEP, READ_TOKEN, TOKENS, bearer
from click.testing import CliRunner
from sqlalchemy import text

from api.cli import api
from storage.db import make_engine


def test_shadow_ab_api_serves_with_tokens_from_the_environment(
    seeded_url: str, unused_port: int
) -> None:
    port = unused_port
    env = {
        **os.environ,
        "SHADOW_AB_API_TOKENS": json.dumps(TOKENS),
        "SHADOW_AB_API_DATABASE_URL": seeded_url,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "shadow_ab", "api", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the API did not come up within 60 s"
            time.sleep(0.2)
        assert httpx.get(f"{base}/v1/deployments").status_code == 401
        r = httpx.get(f"{base}/v1/deployments/{DEP}", headers=bearer(READ_TOKEN))
        assert r.status_code == 200
        assert r.json()["name"] == DEP
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()


def test_tokens_file_flag_and_bad_file(tmp_path: object) -> None:
    result = CliRunner().invoke(api, ["--tokens-file", f"{tmp_path}/missing.yaml"])
    assert result.exit_code == 2
    assert "cannot read the tokens file" in result.output


def test_create_readonly_role_command(seeded_url: str, readonly_role: str) -> None:
    result = CliRunner().invoke(
        api, ["--create-readonly-role", readonly_role, "--database-url", seeded_url]
    )
    assert result.exit_code == 0, result.output
    assert "GRANT SELECT ON ALL TABLES IN SCHEMA" in result.output
    owner = make_engine(seeded_url)
    try:
        with owner.connect() as conn:
            (can_login,) = conn.execute(
                text("SELECT rolcanlogin FROM pg_roles WHERE rolname = :n"), {"n": readonly_role}
            ).one()
            grants = (
                conn.execute(
                    text(
                        "SELECT DISTINCT privilege_type FROM information_schema.role_table_grants"
                        " WHERE grantee = :n"
                    ),
                    {"n": readonly_role},
                )
                .scalars()
                .all()
            )
    finally:
        owner.dispose()
    assert can_login is False
    assert grants == ["SELECT"]


def test_create_role_on_sqlite_says_why_not(tmp_path: object) -> None:
    url = f"sqlite:///{tmp_path}/s.db"
    result = CliRunner().invoke(api, ["--create-readonly-role", "ro", "--database-url", url])
    assert result.exit_code == 1
    assert "PostgreSQL only" in result.output
