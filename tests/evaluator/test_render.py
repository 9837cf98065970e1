"""The renderers: a self-contained HTML page with inline SVG plots, the same content in
Markdown, and JSON, all from the review's JSON body."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import orjson
import pytest
from review_factories import T0, divergence_section, incident_section, latency_section

from evaluator.policy import default_policy
from evaluator.render import RenderError, render
from evaluator.render.plots import divergence_histogram, incident_timeline, latency_cdfs
from evaluator.render.tables import flatten, make_table
from evaluator.review import Review, data_measurements, jsonable
from evaluator.verdict import decide


def body(
    crashes: int = 2, name: str = "llama3-trtllm", notes: list[str] | None = None
) -> dict[str, Any]:
    sections = {
        "latency": latency_section(),
        "incidents": incident_section(candidate_crashes=crashes),
        "divergence": divergence_section(excess=0.05),
    }
    data = {"pairs": 5000, "days": 7.0, "first": T0.isoformat(), "last": None}
    measurements = [m for s in sections.values() for m in s.measurements()]
    measurements += data_measurements(data)
    policy = default_policy()
    review = Review(
        deployment={"name": name, "incumbent_engine": "vllm", "candidate_engine": "trtllm"},
        window=(T0, T0 + timedelta(days=7)),
        policy=policy,
        verdict=decide(policy, measurements),
        sections={k: jsonable(s.to_dict()) for k, s in sections.items()},
        measurements=measurements,
        data=data,
        timings={"latency": 1.5},
        notes=notes or [],
    )
    out: dict[str, Any] = review.to_dict()
    return out


@pytest.fixture(scope="module")
def review_body() -> dict[str, Any]:
    return body()


@pytest.fixture(scope="module")
def html(review_body: dict[str, Any]) -> str:
    return render(review_body, "html")


def test_html_is_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html and "<link" not in html and "<img" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert not re.search(r"url\(\s*['\"]?(https?:)?//", html)
    # The only URLs left are XML namespace names inside the inline SVGs.
    for url in re.findall(r"https?://[^\s\"'<>]+", html):
        assert url.startswith(
            ("http://www.w3.org/", "http://purl.org/dc/", "http://creativecommons.org/")
        ), url


def test_html_shows_the_verdict_and_every_figure(html: str) -> None:
    assert 'class="banner NO-GO"' in html
    assert "divergence.hard_excess_rate" in html  # the failing criterion, with its reason
    # judged at the look's level (day 7 of a 30-day plan), which the page states
    assert re.search(r"whole 1 - \d\.\de-\d\d interval", html) and "widened" in html
    assert "Sequential plan: look 7 of 30" in html
    assert html.count("<svg") == 4  # CDFs, weekly p95, incident timeline, divergence histogram
    for title in ("Latency CDFs", "Weekly p95", "Incidents", "Output divergence"):
        assert title in html
    assert "latency: by day" in html and "2026-11-08" in html  # per-day table
    assert "warm-up after 2 restarts left out" in html  # the section's notes


def test_html_escapes_what_it_shows() -> None:
    page = render(body(name="<script>alert(1)</script>"), "html")
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;" in page


def test_notes_are_shown_first() -> None:
    page = render(body(notes=["Simulated engines: nothing here was measured."]), "html")
    assert page.index("Simulated engines") < page.index('class="banner')
    md = render(body(notes=["Simulated engines: nothing here was measured."]), "md")
    assert md.index("Simulated engines") < md.index("Verdict")


def test_markdown_has_the_same_content(review_body: dict[str, Any]) -> None:
    md = render(review_body, "md")
    assert "Verdict: **NO-GO**" in md
    criteria = md[md.index("## Criteria") :]
    rows = [line for line in criteria.splitlines() if line.startswith("| ")]
    assert rows[0].startswith("| outcome | criterion | value | interval | level | n | reason |")
    assert "Sequential plan: look 7 of 30" in md
    assert any(r.startswith("| FAIL | divergence.hard_excess_rate <= 0.02") for r in rows)
    assert "weekly p95 (plotted)" in md and "2026-W46" in md
    assert "incident timeline (plotted)" in md
    assert "latency: by day" in md


def test_json_round_trips(review_body: dict[str, Any]) -> None:
    again = orjson.loads(render(review_body, "json"))
    assert again == review_body
    assert again["verdict"]["decision"] == "NO-GO"


def test_unknown_format() -> None:
    with pytest.raises(RenderError, match="use one of html, md, json"):
        render({}, "pdf")


def test_plots_without_data_are_left_out() -> None:
    assert latency_cdfs({}) is None
    assert incident_timeline({"timeline": []}) is None
    assert divergence_histogram({"histograms": {"x": {"edges": [0, 1], "x": [1, 2]}}}) is None
    zero = {"histograms": {"edit_similarity": {"edges": [0, 0.5, 1], "candidate": [0, 0]}}}
    assert divergence_histogram(zero) is None
    page = render({"verdict": {"decision": "INCONCLUSIVE", "reason": "no data"}}, "html")
    assert "<svg" not in page and "INCONCLUSIVE" in page


def test_divergence_histogram_has_both_panels() -> None:
    svg = divergence_histogram(divergence_section().to_dict())
    assert svg is not None
    assert "edit similarity to the incumbent" in svg and "first divergence position" in svg
    assert "replay (n=1000)" in svg and "candidate (n=4000)" in svg


def test_incident_timeline_draws_each_incident() -> None:
    svg = incident_timeline(incident_section(candidate_crashes=3).to_dict())
    assert svg is not None and svg.startswith("<svg")
    assert "crash" in svg and "candidate" in svg


def test_tables_flatten_nested_rows() -> None:
    row = {
        "metric": "ttft",
        "incumbent": {"p95": 0.08},
        "ratio": {"p95": {"value": 1.0, "low": 0.9, "high": 1.1}},
    }
    assert flatten(row) == {
        "metric": "ttft",
        "incumbent.p95": 0.08,
        "ratio.p95": {"value": 1.0, "low": 0.9, "high": 1.1},
    }
    table = make_table("t", [row], max_rows=1)
    assert table.rows == [["ttft", "0.08", "1 [0.9, 1.1]"]]
    assert make_table("t", [row, row], max_rows=1).note == "first 1 of 2 rows"


def test_worst_pairs_link_to_the_pair_view() -> None:
    from evaluator.render.html import table_html
    from evaluator.render.tables import make_table

    rows = [{"pair_id": "ab", "kind": "hard", "link": "/v1/deployments/d/pairs/ab?format=html"}]
    cell = str(table_html(make_table("divergence: worst pairs", rows)))
    assert '<a href="/v1/deployments/d/pairs/ab?format=html">side by side</a>' in cell
    plain = str(table_html(make_table("t", [{"link": "javascript:alert(1)"}])))
    assert "<a " not in plain  # only paths and http(s) URLs become links
