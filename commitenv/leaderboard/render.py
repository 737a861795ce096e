"""Render the leaderboard (``LEADERBOARD.md`` and a static ``index.html``) from ``results/<suite>.jsonl``.

The results files are the record of truth: one JSON line per scored submission, appended by the scorer. This
module only reads them and writes two views, so the board can be rebuilt at any time and reviewed as a diff. The
HTML page is self-contained (inline CSS, inline SVG, a few lines of vanilla JS to sort tables, a CSP that forbids
anything external) because it is served as a static file. Names and descriptions are user input: every text is
escaped. Both files are written atomically, after both have rendered, so a failure never leaves a half-written board.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["load_results", "latest_by_name", "render_markdown", "render_html", "render_board"]

DASH = "—"
NORMALIZATION = (
    "score per episode: 100 x (cost_lower - cost) / (cost_lower - cost_upper), lower = {lower} (0), "
    "upper = {upper} (100); an episode that fails the SLO gate scores "
    "min(that, 0) minus the shortfall of its worst hour in attainment points; "
    "suite score = mean with 95 % t-interval"
)
RANKING = ("rank: by the number of episodes not through the SLO gate (fewest first: the gate is a constraint), then "
           "by suite score; a lost episode (crash, timeout, a limit, an invalid action) is scored by the do-nothing "
           "run that replaced it")


# ---------------------------------------------------------------------------------------------------- loading


def load_results(results_dir: Path) -> dict[str, list[dict]]:
    """Suite name -> its records in file order, from every ``results_dir/<suite>.jsonl``; blank lines are skipped.

    A missing folder is an empty board. A line that is not a JSON object with a string ``name`` raises ValueError
    naming ``file:line`` and what was expected."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        return {}
    return {path.stem: _load_file(path) for path in sorted(results_dir.glob("*.jsonl")) if path.is_file()}


def _load_file(path: Path) -> list[dict]:
    records = []
    for lineno, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if raw.strip():
            records.append(_parse_line(path, lineno, raw))
    return records


def _parse_line(path: Path, lineno: int, raw: bytes) -> dict:
    where = f"{path}:{lineno}"
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where}: expected one JSON object per line (a result record), got invalid JSON: {e}") from e
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object (a result record), got {type(record).__name__}")
    if not isinstance(record.get("name"), str) or not record["name"]:
        raise ValueError(f"{where}: expected a result record with a non-empty string 'name'")
    return record


# ---------------------------------------------------------------------------------------------------- ranking


def latest_by_name(records: list[dict]) -> list[dict]:
    """The last record of each submission name (file order), ranked: fewest episodes not through the SLO gate first,
    then by score mean descending (no score last), ties by name."""
    latest: dict[str, dict] = {}
    for record in records:
        latest[record["name"]] = record
    return sorted(latest.values(), key=_rank_key)


def _rank_key(record: dict) -> tuple[bool, float, float, str]:
    """No score last; the gate is a constraint, so fewer episodes failing it rank higher whatever the scores (a
    failed episode's score already carries its shortfall): all through ranks above one failure, one above four."""
    mean = _score(record).get("mean")
    return (not _is_num(mean), _not_through_gate(record), -mean if _is_num(mean) else 0.0, record["name"])


def _not_through_gate(record: dict) -> float:
    """Episodes that did not pass the SLO gate (lost ones included: their do-nothing replacement is scored); inf
    when the record does not say."""
    passed, total = _metric(record, "slo_gate_pass"), _metric(record, "episodes")
    return float(total - passed) if _is_num(passed) and _is_num(total) and total > 0 else math.inf


def _suite_order(results: dict[str, list[dict]]) -> list[str]:
    return sorted(results, key=lambda s: (s != "dev", s))


def _score(record: dict) -> dict:
    return record.get("score") or {}


def _metric(record: dict, key: str) -> Any:
    return (record.get("metrics") or {}).get(key)


def _episodes(record: dict) -> list[dict]:
    return [e for e in record.get("episodes") or [] if isinstance(e, dict)]


def _scenarios(ranked: list[dict]) -> list[str]:
    return sorted({str(e.get("scenario")) for r in ranked for e in _episodes(r)})


def _scenario_mean(record: dict, scenario: str) -> float | None:
    scores = [e["score"] for e in _episodes(record) if str(e.get("scenario")) == scenario and _is_num(e.get("score"))]
    return sum(scores) / len(scores) if scores else None


def _lost(record: dict) -> tuple[int | None, str]:
    """(lost episode count, "crash 1, timeout 2"): episodes the submission did not finish (crash, timeout, over a
    limit, invalid action), from the episodes, else metrics.lost (metrics.failed in older records)."""
    eps = _episodes(record)
    statuses = Counter(str(e.get("status")) for e in eps if e.get("status") not in (None, "ok"))
    detail = ", ".join(f"{s} {n}" for s, n in sorted(statuses.items()))
    if eps:
        return sum(statuses.values()), detail
    count = _metric(record, "lost")
    if not _is_num(count):
        count = _metric(record, "failed")
    return (int(count) if _is_num(count) else None), detail


def _gate_failures(record: dict) -> tuple[int | None, int | None]:
    """(episodes that ran and failed the SLO gate, episodes): counted from the episodes (lost ones apart), else
    metrics.gate_failures, else metrics.episodes - metrics.slo_gate_pass."""
    total = _metric(record, "episodes")
    total = int(total) if _is_num(total) else None
    eps = _episodes(record)
    if eps:
        return sum(1 for e in eps if e.get("status") == "ok" and e.get("slo_gate_pass") is False), total or len(eps)
    count = _metric(record, "gate_failures")
    if not _is_num(count):
        passed = _metric(record, "slo_gate_pass")
        count = total - passed if _is_num(passed) and total is not None else None
    return (int(count) if count is not None else None), total


def _normalization(ranked: list[dict]) -> str:
    refs = [r.get("reference") or {} for r in ranked]
    lower = _distinct(str(ref.get("lower")) for ref in refs if ref.get("lower") is not None) or "?"
    upper = _distinct(str(ref.get("upper")) for ref in refs if ref.get("upper") is not None) or "?"
    return NORMALIZATION.format(lower=lower, upper=upper)


def _suite_hashes(ranked: list[dict]) -> str:
    return _distinct(str(r["suite_hash"]) for r in ranked if r.get("suite_hash"))


def _distinct(values: Iterable[str]) -> str:
    return " / ".join(dict.fromkeys(values))


# ---------------------------------------------------------------------------------------------------- formatting


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x: Any, decimals: int) -> str:
    if not _is_num(x):
        return DASH
    text = f"{x:.{decimals}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text  # no "-0.0"


def _fmt_count(x: Any) -> str:
    if not _is_num(x):
        return DASH
    return str(int(x)) if float(x).is_integer() else f"{x:.1f}"


def _fmt_score(record: dict) -> str:
    score = _score(record)
    if not _is_num(score.get("mean")):
        return DASH
    half = score.get("half_width")
    return f"{_fmt(score['mean'], 1)} ± {_fmt(half, 1)}" if _is_num(half) else _fmt(score["mean"], 1)


def _commit(record: dict) -> str:
    commit = (record.get("provenance") or {}).get("git_commit")
    return str(commit)[:7] if commit else DASH


def _authors(record: dict) -> str:
    authors = record.get("authors")
    if isinstance(authors, list):
        return ", ".join(str(a) for a in authors)
    return str(authors) if authors else ""


def _learns(record: dict) -> str:
    learns = record.get("learns")
    return DASH if learns is None else ("yes" if learns else "no")


def _lost_text(record: dict) -> str:
    count, detail = _lost(record)
    if count is None:
        return DASH
    return f"{count} ({detail})" if count and detail else str(count)


def _gate_text(record: dict) -> str:
    count, total = _gate_failures(record)
    if count is None:
        return DASH
    return f"{count} of {total}" if total is not None else str(count)


# ---------------------------------------------------------------------------------------------------- columns

# One column of the ranked table: key (HTML data-key), header, is it numeric, text cell, sort value (raw, None=null).
Column = tuple[str, str, bool, Callable[[dict], str], Callable[[dict], Any]]

COLUMNS: list[Column] = [
    ("name", "submission", False, lambda r: r["name"], lambda r: r["name"]),
    ("score", "score (mean ± half-width)", True, _fmt_score, lambda r: _score(r).get("mean")),
    ("cost", "cost kWh-eq", True, lambda r: _fmt(_metric(r, "cost_kwh_eq"), 4), lambda r: _metric(r, "cost_kwh_eq")),
    ("attainment", "attainment %", True, lambda r: _fmt(_metric(r, "attainment_pct"), 3),
     lambda r: _metric(r, "attainment_pct")),
    ("gate_failures", "SLO gate failed (episodes)", True, _gate_text, lambda r: _gate_failures(r)[0]),
    ("lost", "lost episodes", True, _lost_text, lambda r: _lost(r)[0]),
    ("misses", "misses", True, lambda r: _fmt_count(_metric(r, "misses")), lambda r: _metric(r, "misses")),
    ("learns", "learns", True, _learns, lambda r: None if r.get("learns") is None else int(bool(r["learns"]))),
    ("authors", "authors", False, _authors, _authors),
    ("commit", "commit", False, _commit, lambda r: _commit(r) if _commit(r) != DASH else None),
    ("submitted", "submitted", False, lambda r: str(r.get("submitted_at") or DASH), lambda r: r.get("submitted_at")),
]


# ---------------------------------------------------------------------------------------------------- markdown


def render_markdown(results: dict[str, list[dict]]) -> str:
    """LEADERBOARD.md: per suite (dev first) the normalization, the ranked table and a per-scenario table."""
    lines = ["# commitenv leaderboard", "",
             "Generated from `results/<suite>.jsonl` by `commitenv.leaderboard.render`; do not edit by hand.", ""]
    if not any(results.values()):
        return "\n".join(lines + ["No results yet.", ""])
    for suite in _suite_order(results):
        lines += _md_suite(suite, latest_by_name(results[suite]))
    return "\n".join(lines)


def _md_cell(text: Any) -> str:
    """A markdown table cell: no line breaks, `|` escaped, and inline HTML shown as text."""
    text = " ".join(str(text).split())
    return html.escape(text, quote=False).replace("|", "\\|")


def _md_row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(_md_cell(c) for c in cells) + " |"


def _md_table(header: list[str], rows: list[list[Any]], numeric: list[bool]) -> list[str]:
    align = ["---:" if n else ":---" for n in numeric]
    return [_md_row(header), "| " + " | ".join(align) + " |", *(_md_row(r) for r in rows)]


def _md_suite(suite: str, ranked: list[dict]) -> list[str]:
    lines = [f"## Suite `{suite}`", ""]
    if not ranked:
        return lines + ["No results yet.", ""]
    lines += [_normalization(ranked) + ".", "", RANKING + ".", ""]
    if hashes := _suite_hashes(ranked):
        lines += [f"Suite hash: `{hashes}`.", ""]
    header = ["rank"] + [c[1] for c in COLUMNS]
    rows = [[i] + [c[3](r) for c in COLUMNS] for i, r in enumerate(ranked, start=1)]
    lines += _md_table(header, rows, [True] + [c[2] for c in COLUMNS]) + [""]
    return lines + _md_breakdown(ranked)


def _md_breakdown(ranked: list[dict]) -> list[str]:
    scenarios = _scenarios(ranked)
    if not scenarios:
        return []
    rows = [[r["name"]] + [_fmt(_scenario_mean(r, s), 1) for s in scenarios] for r in ranked]
    lines = ["Mean episode score per scenario:", ""]
    return lines + _md_table(["submission", *scenarios], rows, [False] + [True] * len(scenarios)) + [""]


# ---------------------------------------------------------------------------------------------------- html

CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 80rem; padding: 0 1rem; color: #222; }
table { border-collapse: collapse; margin: 1rem 0; font-size: 0.9rem; }
th, td { border: 1px solid #ccc; padding: 0.3rem 0.5rem; text-align: left; vertical-align: top; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
.scroll { overflow-x: auto; }
th button { all: inherit; border: none; padding: 0; cursor: pointer; }
th[aria-sort="ascending"] button::after { content: " \\25B2"; }
th[aria-sort="descending"] button::after { content: " \\25BC"; }
.desc { color: #666; font-size: 0.8rem; }
.note { color: #444; font-size: 0.85rem; }
svg text { font-size: 11px; fill: #222; }
svg .axis { stroke: #444; }
svg .grid { stroke: #e4e4e4; }
svg circle { fill: #1f77b4; }
""".strip()

SORT_JS = """
(function () {
  function value(row, index, numeric) {
    var v = row.cells[index].getAttribute("data-value");
    if (v === null || v === "") { return null; }
    return numeric ? parseFloat(v) : v;
  }
  function sortBy(table, th) {
    var headers = Array.prototype.slice.call(th.parentNode.children);
    var index = headers.indexOf(th);
    var numeric = th.getAttribute("data-type") === "num";
    var dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = value(a, index, numeric), y = value(b, index, numeric), c = 0;
      if (x === null || y === null) {
        c = x === y ? 0 : (x === null ? 1 : -1);
      } else {
        c = numeric ? x - y : (x < y ? -1 : (x > y ? 1 : 0));
        if (dir === "descending") { c = -c; }
      }
      return c || (parseInt(a.getAttribute("data-rank"), 10) - parseInt(b.getAttribute("data-rank"), 10));
    });
    rows.forEach(function (row) { body.appendChild(row); });
    headers.forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", dir);
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("thead th").forEach(function (th) {
      th.addEventListener("click", function () { sortBy(table, th); });
    });
  });
})();
""".strip()
_SCRIPT_BODY = f"\n{SORT_JS}\n"  # exactly what goes between <script> and </script>: the CSP hashes these bytes


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _csp() -> str:
    """Nothing external, and only our own inline script runs (by hash), even if some text escaped escaping."""
    digest = base64.b64encode(hashlib.sha256(_SCRIPT_BODY.encode("utf-8")).digest()).decode("ascii")
    return (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


def render_html(results: dict[str, list[dict]]) -> str:
    """A self-contained static page with the same content as the markdown, sortable tables and a scatter per suite."""
    if any(results.values()):
        body = "\n".join(_html_suite(s, latest_by_name(results[s])) for s in _suite_order(results))
    else:
        body = '<p class="empty">No results yet.</p>'
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_e(_csp())}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>commitenv leaderboard</title>", f"<style>\n{CSS}\n</style>", "</head>", "<body>",
        "<h1>commitenv leaderboard</h1>", body, f"<script>{_SCRIPT_BODY}</script>", "</body>", "</html>", "",
    ])


def _html_suite(suite: str, ranked: list[dict]) -> str:
    parts = [f'<section id="suite-{_e(suite)}">', f"<h2>Suite <code>{_e(suite)}</code></h2>"]
    if not ranked:
        return "\n".join(parts + ['<p class="empty">No results yet.</p>', "</section>"])
    parts.append(f'<p class="note">{_e(_normalization(ranked))}.</p>')
    parts.append(f'<p class="note">{_e(RANKING)}.</p>')
    if hashes := _suite_hashes(ranked):
        parts.append(f'<p class="note">Suite hash: <code>{_e(hashes)}</code>.</p>')
    parts += [_html_board(suite, ranked), _scatter_svg(suite, ranked), _html_breakdown(suite, ranked), "</section>"]
    return "\n".join(parts)


def _data_value(x: Any) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return ""
    if isinstance(x, int) and not isinstance(x, bool):
        return str(x)
    return repr(float(x)) if _is_num(x) else str(x)


def _th(key: str, label: str, numeric: bool, sorted_as: str | None = None) -> str:
    aria = f' aria-sort="{sorted_as}"' if sorted_as else ""
    cls = ' class="num"' if numeric else ""
    kind = "num" if numeric else "text"
    return f'<th data-key="{_e(key)}" data-type="{kind}"{cls}{aria}><button type="button">{_e(label)}</button></th>'


def _html_board(suite: str, ranked: list[dict]) -> str:
    head = [_th("rank", "rank", True, "ascending")] + [_th(k, label, num) for k, label, num, _, _ in COLUMNS]
    rows = [_html_board_row(i, r) for i, r in enumerate(ranked, start=1)]
    table = f'<div class="scroll"><table class="board sortable" id="board-{_e(suite)}">'
    return "\n".join([table, "<thead><tr>", *head, "</tr></thead>", "<tbody>", *rows, "</tbody>", "</table></div>"])


def _html_board_row(rank: int, record: dict) -> str:
    cells = [f'<td class="num" data-value="{rank}">{rank}</td>']
    for key, _, numeric, text, value in COLUMNS:
        content = _e(text(record))
        if key == "name" and record.get("description"):
            content += f'<div class="desc">{_e(record["description"])}</div>'
        cls = ' class="num"' if numeric else ""
        cells.append(f'<td{cls} data-value="{_e(_data_value(value(record)))}">{content}</td>')
    return f'<tr data-name="{_e(record["name"])}" data-rank="{rank}">{"".join(cells)}</tr>'


def _html_breakdown(suite: str, ranked: list[dict]) -> str:
    scenarios = _scenarios(ranked)
    if not scenarios:
        return ""
    head = "".join([_th("name", "submission", False)] + [_th(s, s, True) for s in scenarios])
    rows = []
    for rank, r in enumerate(ranked, start=1):
        cells = [f'<td data-value="{_e(r["name"])}">{_e(r["name"])}</td>']
        for s in scenarios:
            mean = _scenario_mean(r, s)
            cells.append(f'<td class="num" data-value="{_e(_data_value(mean))}">{_e(_fmt(mean, 1))}</td>')
        rows.append(f'<tr data-name="{_e(r["name"])}" data-rank="{rank}">{"".join(cells)}</tr>')
    return "\n".join(["<h3>Mean episode score per scenario</h3>",
                      f'<div class="scroll"><table class="breakdown sortable" id="breakdown-{_e(suite)}">',
                      f"<thead><tr>{head}</tr></thead>", "<tbody>", *rows, "</tbody>", "</table></div>"])


# ---------------------------------------------------------------------------------------------------- scatter

W, H = 640, 400
MARGIN = {"left": 70, "right": 30, "top": 20, "bottom": 50}


def _nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Round tick values (steps of 1, 2 or 5 x 10^k) covering [lo, hi]; the first and last are the axis ends."""
    if hi - lo <= 0:
        pad = abs(lo) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    raw = (hi - lo) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if raw <= m * mag * (1 + 1e-9))
    start, stop = math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step
    return [start + i * step for i in range(round((stop - start) / step) + 1)]


def _tick_label(value: float, ticks: list[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    return _fmt(value, max(0, -math.floor(math.log10(step) + 1e-9)))


def _scale(ticks: list[float], a: float, b: float) -> Callable[[float], float]:
    lo, hi = ticks[0], ticks[-1]
    return lambda v: a + (v - lo) / (hi - lo) * (b - a)


def _scatter_svg(suite: str, ranked: list[dict]) -> str:
    points = [(r["name"], _metric(r, "cost_kwh_eq"), _metric(r, "attainment_pct")) for r in ranked]
    points = [(n, x, y) for n, x, y in points if _is_num(x) and _is_num(y)]
    if not points:
        return '<p class="note">No submission has both a cost and an attainment to plot.</p>'
    xt = _nice_ticks(min(p[1] for p in points), max(p[1] for p in points))
    yt = _nice_ticks(min(p[2] for p in points), max(p[2] for p in points))
    x0, x1, y0, y1 = MARGIN["left"], W - MARGIN["right"], H - MARGIN["bottom"], MARGIN["top"]
    sx, sy = _scale(xt, x0, x1), _scale(yt, y0, y1)
    title = f"Cost vs SLO attainment, suite {suite}"
    parts = [f'<svg class="scatter" id="scatter-{_e(suite)}" xmlns="http://www.w3.org/2000/svg" width="{W}" '
             f'height="{H}" viewBox="0 0 {W} {H}" role="img" aria-label="{_e(title)}">', f"<title>{_e(title)}</title>"]
    parts += _axis_x(xt, sx, y0, y1) + _axis_y(yt, sy, x0, x1)
    parts += [f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x1}" y2="{y0}"/>',
              f'<line class="axis" x1="{x0}" y1="{y0}" x2="{x0}" y2="{y1}"/>',
              f'<text x="{(x0 + x1) / 2:.1f}" y="{H - 10}" text-anchor="middle">'
              "mean cost (kWh-eq, lower is better)</text>",
              f'<text x="16" y="{(y0 + y1) / 2:.1f}" text-anchor="middle" '
              f'transform="rotate(-90 16 {(y0 + y1) / 2:.1f})">mean SLO attainment (%)</text>']
    parts += [_point(n, sx(x), sy(y), x, y, right=sx(x) > (x0 + x1) / 2) for n, x, y in points]
    return "\n".join(parts + ["</svg>"])


def _axis_x(ticks: list[float], sx: Callable[[float], float], y0: float, y1: float) -> list[str]:
    out = []
    for t in ticks:
        x = sx(t)
        out += [f'<line class="grid" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}"/>',
                f'<line class="axis" x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y0 + 5}"/>',
                f'<text x="{x:.1f}" y="{y0 + 18}" text-anchor="middle">{_e(_tick_label(t, ticks))}</text>']
    return out


def _axis_y(ticks: list[float], sy: Callable[[float], float], x0: float, x1: float) -> list[str]:
    out = []
    for t in ticks:
        y = sy(t)
        out += [f'<line class="grid" x1="{x0}" y1="{y:.1f}" x2="{x1}" y2="{y:.1f}"/>',
                f'<line class="axis" x1="{x0 - 5}" y1="{y:.1f}" x2="{x0}" y2="{y:.1f}"/>',
                f'<text x="{x0 - 8}" y="{y + 4:.1f}" text-anchor="end">{_e(_tick_label(t, ticks))}</text>']
    return out


def _point(name: str, px: float, py: float, x: float, y: float, right: bool) -> str:
    anchor, dx = ("end", -7) if right else ("start", 7)
    tip = f"{name}: cost {_fmt(x, 4)} kWh-eq, attainment {_fmt(y, 3)} %"
    return (f'<g class="point" data-name="{_e(name)}"><circle cx="{px:.1f}" cy="{py:.1f}" r="4">'
            f'<title>{_e(tip)}</title></circle>'
            f'<text x="{px + dx:.1f}" y="{py - 6:.1f}" text-anchor="{anchor}">{_e(name)}</text></g>')


# ---------------------------------------------------------------------------------------------------- writing


def render_board(board_dir: Path) -> tuple[Path, Path]:
    """Read ``board_dir/results/*.jsonl``; write ``LEADERBOARD.md`` and ``index.html`` there, atomically.

    Both texts are rendered before either file is touched, so a rendering error leaves the old board as it was."""
    board_dir = Path(board_dir)
    if not board_dir.is_dir():
        raise ValueError(f"{board_dir}: no such folder; expected a leaderboard folder holding results/<suite>.jsonl")
    results = load_results(board_dir / "results")
    markdown, page = render_markdown(results), render_html(results)
    md_path, html_path = board_dir / "LEADERBOARD.md", board_dir / "index.html"
    _write_atomic(md_path, markdown)
    _write_atomic(html_path, page)
    return md_path, html_path


def _write_atomic(path: Path, text: str) -> None:
    """Write a temp file in the same folder, then os.replace it over ``path``; no temp file outlives a failure."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
