"""``shadow-ab report``: the report of a deployment's go/no-go review, as HTML, Markdown or JSON.

::

    shadow-ab report --deployment D [--from T] [--to T] [--policy P|default]
                     [--format html|md|json] [-o PATH] [--database-url URL] [--no-store]

The window defaults to all of the deployment's mirrored traffic; the policy to the one stored
with the deployment (``deployments.policy``), else the shipped default. A progress bar goes to
stderr while the analyses run, then one line with the verdict; the report goes to ``-o PATH``
or stdout. The review is stored in ``reports`` (``--no-store`` to skip).

Exit status: 0 the report was written (whatever the verdict); 1 a store error; 2 a bad argument
(unknown deployment, empty window, bad policy or time); 3 the database is unreachable.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from sqlalchemy import select

from evaluator.compare import NEAR_TIE_NATS
from evaluator.errors import EvaluatorError
from evaluator.policy import MAX_NEAR_TIE_NATS, Policy, load_policy, parse_policy
from evaluator.render import FORMATS, render
from evaluator.review import (
    Analyses,
    Review,
    build_review,
    default_analyses,
    deployment_info,
    resolve_window,
)
from shadow_ab.cli_support import parse_time, resolve_url, url_option
from storage.cli_support import storage_errors
from storage.db import make_engine
from storage.errors import translate
from storage.models import DEPLOYMENTS

PROGRESS_STEPS = 1000


class ProgressBar:
    """A click progress bar on stderr driven by ``(stage, fraction)`` callbacks."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None
        self._done = 0

    def __enter__(self) -> ProgressBar:
        if self.enabled:
            self._bar = click.progressbar(
                length=PROGRESS_STEPS,
                label="reviewing",
                file=sys.stderr,
                show_percent=True,
                show_eta=False,
                item_show_func=lambda stage: stage or "",
            )
            self._bar.__enter__()
        return self

    def __call__(self, stage: str, fraction: float) -> None:
        if self._bar is None:
            return
        target = int(max(0.0, min(1.0, fraction)) * PROGRESS_STEPS)
        if target > self._done:
            self._bar.update(target - self._done, current_item=stage)
            self._done = target
        else:
            self._bar.current_item = stage
            self._bar.render_progress()

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)


def stored_policy(engine: Any, deployment: str) -> Policy | None:
    """The policy kept with the deployment (``deployments.policy``), if any."""
    with engine.connect() as conn:
        raw = conn.execute(
            select(DEPLOYMENTS.c.policy).where(DEPLOYMENTS.c.name == deployment)
        ).scalar_one_or_none()
    return parse_policy(raw, f"deployments.policy of {deployment}") if raw else None


def summary_line(review: Review, target: str) -> str:
    counts = review.verdict.counts()
    tally = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
    stored = f" (report #{review.report_id})" if review.report_id is not None else ""
    return (
        f"{review.decision}: {review.verdict.reason}\n"
        f"  {review.data['pairs']} pairs over {review.data['days']:.3g} days; criteria: {tally};"
        f" {target}{stored}"
    )


def _analyses(api_url: str) -> Analyses | None:
    """The default analyses, with the divergence options when they differ from the defaults
    (the near-tie margin is the policy's: :func:`_with_near_tie`)."""
    if not api_url:
        return None
    from evaluator.divergence import DivergenceConfig

    return default_analyses(divergence_config=DivergenceConfig(api_base_url=api_url))


def _with_near_tie(policy: Policy, near_tie_nats: float | None) -> Policy:
    """``policy`` with ``--near-tie-nats`` when given (it overrides the policy's, said in the
    report's notes)."""
    if near_tie_nats is None or near_tie_nats == policy.near_tie_nats:
        return policy
    was = policy.near_tie_nats if policy.near_tie_nats is not None else NEAR_TIE_NATS
    note = f"near_tie_nats set to {near_tie_nats:g} by --near-tie-nats (the policy's: {was:g})"
    return replace(policy, near_tie_nats=near_tie_nats, notes=(*policy.notes, note))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--deployment", "-d", required=True, help="The deployment to review.")
@click.option(
    "--from", "from_", metavar="TIME", help="Window start, ISO 8601 (default: first pair)."
)
@click.option(
    "--to",
    "to",
    metavar="TIME",
    help="Window end, ISO 8601, exclusive (default: after the last pair).",
)
@click.option(
    "--policy",
    metavar="PATH|default",
    help="Verdict policy YAML (default: the deployment's stored policy, else the shipped one).",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="html",
    show_default=True,
    help="html: a self-contained page with plots; md: Markdown; json: for automation.",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write here (default: stdout).",
)
@click.option("--no-store", is_flag=True, help="Do not keep the review in the reports table.")
@click.option(
    "--near-tie-nats",
    type=click.FloatRange(min=0.0, max=MAX_NEAR_TIE_NATS),
    default=None,
    help="A divergence is a near tie when the logprob margin at its first token is within this"
    f" (default: the policy's near_tie_nats, else {NEAR_TIE_NATS:g}).",
)
@click.option(
    "--api-url",
    metavar="URL",
    default="",
    help="The query API's address, for the report's links to each worst pair's side-by-side"
    " view (default: links relative to the API's root, /v1/deployments/...).",
)
@click.option(
    "--progress/--no-progress", default=True, show_default=True, help="Progress bar on stderr."
)
@click.option(
    "--probes",
    metavar="PATH|default",
    default=None,
    help="The probe set the mirror sent (its probes.set): 'default' or the JSON-lines file;"
    " probe answers are scored against it.",
)
@url_option
@storage_errors
def report(
    deployment: str,
    from_: str | None,
    to: str | None,
    policy: str | None,
    fmt: str,
    output: Path | None,
    no_store: bool,
    near_tie_nats: float | None,
    api_url: str,
    progress: bool,
    database_url: str | None,
    probes: str | None = None,
) -> None:
    """Review a deployment and write the go/no-go report (verdict, criteria, plots, tables)."""
    url = resolve_url(database_url)
    start, end = parse_time(from_, "--from"), parse_time(to, "--to")
    engine = make_engine(url)
    try:
        with translate():
            try:
                deployment_info(engine, deployment)  # an unknown one lists the known ones
                chosen = load_policy(policy) if policy else stored_policy(engine, deployment)
                chosen = _with_near_tie(chosen or load_policy(None), near_tie_nats)
                run = _analyses(api_url)
                if probes is not None:
                    from evaluator.divergence import DivergenceConfig
                    from evaluator.quality import QualityConfig
                    from shadow_ab.probes import ProbeSetError, load_probe_set

                    try:
                        load_probe_set(probes)
                    except ProbeSetError as exc:
                        raise click.UsageError(f"--probes: {exc}") from None
                    run = default_analyses(
                        divergence_config=DivergenceConfig(api_base_url=api_url),
                        quality_config=QualityConfig(probe_set=probes),
                    )
                window = resolve_window(engine, deployment, start, end)
                with ProgressBar(progress) as bar:
                    review = build_review(
                        engine,
                        deployment,
                        window,
                        chosen,
                        bar,
                        store=not no_store,
                        with_html=fmt == "html" or not no_store,
                        analyses=run,
                    )
            except EvaluatorError as exc:
                raise click.UsageError(str(exc)) from None
        text = review.html if fmt == "html" and review.html else render(review.to_dict(), fmt)
        if output is None:
            click.echo(text, nl=not text.endswith("\n"))
            target = "report on stdout"
        else:
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(text)
            target = f"report written to {output}"
        click.echo(summary_line(review, target), err=True)
    finally:
        engine.dispose()
