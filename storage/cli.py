"""``shadow-ab db``: migrate the store, manage its partitions, apply retention.

The database URL comes from ``--database-url``, else ``SHADOW_AB_DATABASE_URL`` (see
:class:`shadow_ab.settings.CommonSettings`). Storage errors are shown as one line saying what to
do, with exit status 1 (2 for a bad URL, 3 when the database is unreachable).
"""

from __future__ import annotations

import click

from shadow_ab.cli_support import resolve_url, url_option
from storage.cli_support import storage_errors
from storage.db import make_engine
from storage.migrate import current, downgrade, head, upgrade
from storage.partitions import apply_retention, ensure_partitions


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def db() -> None:
    """Migrate the store and manage its partitions and retention."""


@db.command("upgrade")
@url_option
@click.option("--revision", default="head", show_default=True, help="Target revision.")
@click.option(
    "--days-ahead",
    default=7,
    show_default=True,
    type=click.IntRange(min=0),
    help="PostgreSQL: also create daily partitions from today to this many days ahead.",
)
@storage_errors
def upgrade_cmd(database_url: str | None, revision: str, days_ahead: int) -> None:
    """Create or migrate the schema (idempotent)."""
    url = resolve_url(database_url)
    upgrade(url, revision)
    rev = current(url)
    click.echo(f"store at revision {rev}")
    if rev == head():
        engine = make_engine(url)
        try:
            created = ensure_partitions(engine, days_ahead=days_ahead)
        finally:
            engine.dispose()
        if created:
            click.echo(f"created {len(created)} partitions: {', '.join(created)}")


@db.command("downgrade")
@url_option
@click.option(
    "--revision", required=True, help="Target revision ('base' removes every table, data too)."
)
@storage_errors
def downgrade_cmd(database_url: str | None, revision: str) -> None:
    """Migrate the schema down to REVISION."""
    url = resolve_url(database_url)
    downgrade(url, revision)
    click.echo(f"store at revision {current(url) or 'base'}")


@db.command("current")
@url_option
@storage_errors
def current_cmd(database_url: str | None) -> None:
    """Print the store's revision (and whether it is the newest)."""
    url = resolve_url(database_url)
    rev = current(url)
    newest = head()
    if rev is None:
        click.echo(f"not migrated (newest is {newest}): run `shadow-ab db upgrade`")
    elif rev == newest:
        click.echo(f"{rev} (head)")
    else:
        click.echo(f"{rev} (newest is {newest}: run `shadow-ab db upgrade`)")


@db.command("partitions")
@url_option
@click.option(
    "--days-ahead",
    default=7,
    show_default=True,
    type=click.IntRange(min=0),
    help="Create partitions from today (UTC) to this many days ahead.",
)
@storage_errors
def partitions_cmd(database_url: str | None, days_ahead: int) -> None:
    """PostgreSQL: create the daily partitions ahead of time (idempotent)."""
    url = resolve_url(database_url)
    engine = make_engine(url)
    try:
        if engine.dialect.name != "postgresql":
            click.echo("SQLite tables are not partitioned: nothing to do")
            return
        created = ensure_partitions(engine, days_ahead=days_ahead)
    finally:
        engine.dispose()
    click.echo(
        f"created {len(created)} partitions" + (f": {', '.join(created)}" if created else "")
    )


@db.command("retention")
@url_option
@click.option(
    "--keep-days",
    required=True,
    type=click.IntRange(min=0),
    help="Keep today (UTC) and this many days before it; remove everything older.",
)
@click.option("--dry-run", is_flag=True, help="Show what would be removed; change nothing.")
@storage_errors
def retention_cmd(database_url: str | None, keep_days: int, dry_run: bool) -> None:
    """Remove exchanges, health samples and drop counts older than --keep-days.

    PostgreSQL drops whole daily partitions; SQLite deletes rows."""
    url = resolve_url(database_url)
    engine = make_engine(url)
    try:
        plan = apply_retention(engine, keep_days, dry_run=dry_run)
    finally:
        engine.dispose()
    verb = "would remove" if dry_run else "removed"
    click.echo(f"cutoff {plan.cutoff.isoformat()}: {verb} everything before it")
    for name in plan.partitions:
        click.echo(f"  {'would drop' if dry_run else 'dropped'} partition {name}")
    for table, count in plan.rows.items():
        click.echo(f"  {table}: {verb} {count} rows")
