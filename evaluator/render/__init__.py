"""The review rendered for people and for automation: self-contained HTML, Markdown, JSON.

Every renderer takes the review's JSON body (``Review.to_dict()``, also stored in
``reports.body``), so a stored report can be rendered again without the database::

    render(body, "html" | "md" | "json") -> str

- :mod:`evaluator.render.html`: one HTML page with no external assets (inline CSS, matplotlib
  plots as inline SVG): verdict banner, criteria table, latency CDFs of both engines overlaid,
  weekly p95 trend, incident timeline, divergence histogram, the tables per day/week/bucket;
- :mod:`evaluator.render.markdown`: the same content as Markdown tables (plots as their data);
- :mod:`evaluator.render.plots`: the figures (matplotlib, Agg backend) as SVG text;
- :mod:`evaluator.render.tables`: flattening the sections' nested rows into table columns.

Errors: :class:`~evaluator.errors.RenderError` (an :class:`~evaluator.errors.EvaluatorError`)
for an unknown format.
"""

from __future__ import annotations

from typing import Any

import orjson

from evaluator.errors import RenderError

FORMATS = ("html", "md", "json")


def render_json(body: dict[str, Any]) -> str:
    return orjson.dumps(
        body, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    ).decode()


def render(body: dict[str, Any], fmt: str) -> str:
    """The review ``body`` as ``fmt`` (html, md or json)."""
    if fmt == "json":
        return render_json(body)
    if fmt == "md":
        from evaluator.render.markdown import render_markdown

        return render_markdown(body)
    if fmt == "html":
        from evaluator.render.html import render_html

        return render_html(body)
    raise RenderError(f"unknown report format {fmt!r}: use one of {', '.join(FORMATS)}")


__all__ = ["FORMATS", "RenderError", "render", "render_json"]
