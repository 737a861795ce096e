"""The leaderboard views: LEADERBOARD.md and index.html rendered from hand-written results files, checked against
numbers worked out by hand, plus a headless-Chromium check of the page's rows, sorting and escaping."""

from __future__ import annotations

import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from commitenv.leaderboard import render
from commitenv.leaderboard.render import latest_by_name, load_results, render_board, render_html, render_markdown

HOSTILE = "<script>window.__pwned=1</script> | x"
HOSTILE_DESC = '<img src=x onerror="window.__pwned=2">'
CHROMIUM = Path("/usr/bin/chromium")


def _ep(scenario: str, seed: int | None, score: float | None, status: str = "ok", gate: bool = True) -> dict:
    return {"scenario": scenario, "seed": seed, "label": f"{scenario}/{seed}", "status": status,
            "reason": None if status == "ok" else "boom", "score": score, "cost_kwh_eq": 0.1, "lower_cost_kwh_eq": 1.0,
            "upper_cost_kwh_eq": 0.0, "attainment_pct": 99.0, "slo_gate_pass": gate, "misses": 1, "energy_mj": 1.0,
            "mean_abs_dev_pct": 1.0, "wall_s": 1.0}


def _record(name: str, mean: float | None, half: float | None, metrics: dict, episodes: list[dict], **over) -> dict:
    rec = {"name": name, "authors": ["commitenv maintainers"], "description": f"{name} controller", "learns": False,
           "suite": "dev", "suite_hash": "sha256:ab12", "seeds_hash": None, "submitted_at": "2026-12-01T13:05:00Z",
           "wall_s": 10.0,
           "score": {"n": len(episodes), "mean": mean, "sd": None, "half_width": half,
                     "ci95": None if half is None else [mean - half, mean + half]},
           "reference": {"lower": "vllm", "upper": "oracle"}, "metrics": metrics, "episodes": episodes,
           "provenance": {"commitenv_version": "0.1.0", "git_commit": "27480dbabcdef0123", "python": "3.11.2",
                          "packages": {}, "submission_hash": "sha256:00"}}
    rec.update(over)
    return rec


def _metrics(cost, att, misses, passed, episodes, failed) -> dict:
    return {"cost_kwh_eq": cost, "attainment_pct": att, "misses": misses, "energy_mj": 1.0, "mean_abs_dev_pct": 1.0,
            "slo_gate_pass": passed, "episodes": episodes, "failed": failed}


def dev_records() -> list[dict]:
    """Four submissions on two scenarios (plus an older epact line that the later one replaces):
    hostile 80.0, epact 70.5625, fixed 5.0 (one crashed episode, no interval), broken (no score at all)."""
    old_epact = _record("epact", 99.0, 1.0, _metrics(0.5, 99.0, 1.0, 4, 4, 0), [_ep("bench-a", 1, 99.0)])
    epact = _record("epact", 70.5625, 12.34, _metrics(0.01, 99.5, 120.0, 4, 4, 0),
                    [_ep("bench-a", 1, 72.25), _ep("bench-a", 2, 70.0),
                     _ep("bench-b", 1, 80.0), _ep("bench-b", 2, 60.0)])
    hostile = _record(HOSTILE, 80.0, 3.0, _metrics(0.02, 98.25, 300.5, 4, 4, 0),
                      [_ep("bench-a", 1, 90.0), _ep("bench-a", 2, 85.0),
                       _ep("bench-b", 1, 75.0), _ep("bench-b", 2, 70.0)],
                      description=HOSTILE_DESC, authors=["Mallory <m@x>"], submitted_at="2026-12-02T10:00:00Z",
                      provenance={"git_commit": "0123456789abcdef"})
    fixed = _record("fixed", 5.0, None, _metrics(1.16, 97.0, 1000.0, 2, 4, 1),
                    [_ep("bench-a", 1, 10.0), _ep("bench-a", 2, 0.0, status="crash", gate=False),
                     _ep("bench-b", 1, 20.0), _ep("bench-b", 2, -10.0, gate=False)],
                    learns=True, authors=["a", "b"], provenance={"git_commit": None})
    broken = _record("broken", None, None, _metrics(None, None, None, None, None, None), [])
    return [old_epact, epact, hostile, fixed, broken]


SCORE_ORDER = [HOSTILE, "epact", "fixed", "broken"]


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def make_board(root: Path) -> Path:
    _write_jsonl(root / "results" / "dev.jsonl", dev_records())
    _write_jsonl(root / "results" / "test.jsonl",
                 [_record("epact", 60.0, None, _metrics(0.1, 99.0, 5.0, 1, 1, 0), [_ep("hidden", None, 60.0)])])
    _write_jsonl(root / "results" / "alpha.jsonl",
                 [_record("epact", 50.0, None, _metrics(0.1, 99.0, 5.0, 1, 1, 0), [_ep("bench-a", 1, 50.0)])])
    return root


@pytest.fixture
def board(tmp_path: Path) -> Path:
    return make_board(tmp_path / "board")


# ---------------------------------------------------------------------------------------------------- loading


def test_load_results_reads_every_suite_in_file_order(board: Path) -> None:
    results = load_results(board / "results")
    assert sorted(results) == ["alpha", "dev", "test"]
    assert [r["name"] for r in results["dev"]] == ["epact", "epact", HOSTILE, "fixed", "broken"]
    assert load_results(board / "missing") == {}


def test_malformed_line_names_file_and_line(board: Path) -> None:
    path = board / "results" / "dev.jsonl"
    good = json.dumps(dev_records()[1])
    path.write_text(good + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:3: expected one JSON object per line")):
        load_results(board / "results")
    path.write_text(good + "\n[1, 2]\n", encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: expected a JSON object") + ".*got list"):
        render_board(board)
    path.write_text('{"score": {}}\n', encoding="utf-8")
    expected = f"{path}:1: expected a result record with a non-empty string 'name'"
    with pytest.raises(ValueError, match=re.escape(expected)):
        load_results(board / "results")


def test_latest_by_name_keeps_last_and_ranks() -> None:
    recs = [{"name": "a", "score": {"mean": 1.0}}, {"name": "b", "score": {"mean": None}},
            {"name": "d", "score": {"mean": 5.0}}, {"name": "a", "score": {"mean": 10.0}, "tag": "new"},
            {"name": "c", "score": {"mean": 5.0}}, {"name": "e", "score": None}]
    ranked = latest_by_name(recs)
    assert [r["name"] for r in ranked] == ["a", "c", "d", "b", "e"]
    assert ranked[0]["tag"] == "new"


# ---------------------------------------------------------------------------------------------------- markdown

MD_DEV_TABLE = """\
| rank | submission | score (mean ± half-width) | cost kWh-eq | attainment % | SLO gate failed (episodes) | lost episodes | misses | learns | authors | commit | submitted |
| ---: | :--- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :--- | :--- | :--- |
| 1 | &lt;script&gt;window.__pwned=1&lt;/script&gt; \\| x | 80.0 ± 3.0 | 0.0200 | 98.250 | 0 of 4 | 0 | 300.5 | no | Mallory &lt;m@x&gt; | 0123456 | 2026-12-02T10:00:00Z |
| 2 | epact | 70.6 ± 12.3 | 0.0100 | 99.500 | 0 of 4 | 0 | 120 | no | commitenv maintainers | 27480db | 2026-12-01T13:05:00Z |
| 3 | fixed | 5.0 | 1.1600 | 97.000 | 1 of 4 | 1 (crash 1) | 1000 | yes | a, b | — | 2026-12-01T13:05:00Z |
| 4 | broken | — | — | — | — | — | — | no | commitenv maintainers | 27480db | 2026-12-01T13:05:00Z |
"""

# bench-a: hostile (90+85)/2, epact (72.25+70)/2 = 71.125, fixed (10+0)/2; bench-b: (75+70)/2, (80+60)/2, (20-10)/2
MD_DEV_BREAKDOWN = """\
| submission | bench-a | bench-b |
| :--- | ---: | ---: |
| &lt;script&gt;window.__pwned=1&lt;/script&gt; \\| x | 87.5 | 72.5 |
| epact | 71.1 | 70.0 |
| fixed | 5.0 | 5.0 |
| broken | — | — |
"""

NORMALIZATION = ("score per episode: 100 x (cost_lower - cost) / (cost_lower - cost_upper), lower = vllm (0), "
                 "upper = oracle (100); an episode that fails the SLO gate scores "
                 "min(that, 0) minus the shortfall of its worst hour in attainment points; "
                 "suite score = mean with 95 % t-interval")


def test_markdown_tables_by_hand(board: Path) -> None:
    md_path, html_path = render_board(board)
    assert (md_path, html_path) == (board / "LEADERBOARD.md", board / "index.html")
    md = md_path.read_text(encoding="utf-8")
    assert MD_DEV_TABLE in md
    assert MD_DEV_BREAKDOWN in md
    assert NORMALIZATION + "." in md
    headings = re.findall(r"^## Suite `(\w+)`$", md, flags=re.M)
    assert headings == ["dev", "alpha", "test"]
    assert "<script>" not in md


def test_gate_passing_submissions_rank_above_gate_failing_ones(tmp_path: Path) -> None:
    """Hand-built rows: 'bold' scores 90 but fails the gate on 4 of 6 episodes, 'safe' scores 10 passing 6/6,
    'shaky' scores 95 with one gate failure and one crash (its do-nothing replacement failed the gate too)."""
    bold_eps = [_ep("bench-a", i, 90.0, gate=i >= 4) for i in range(6)]  # seeds 0-3 fail the gate
    safe_eps = [_ep("bench-a", i, 10.0) for i in range(6)]
    shaky_eps = ([_ep("bench-a", 0, 95.0, gate=False), _ep("bench-a", 1, -5.0, status="timeout", gate=False)]
                 + [_ep("bench-a", i, 95.0) for i in range(2, 6)])
    recs = [_record("bold", 90.0, None, _metrics(0.1, 95.0, 9.0, 2, 6, 0), bold_eps),
            _record("safe", 10.0, None, _metrics(0.9, 99.0, 1.0, 6, 6, 0), safe_eps),
            _record("shaky", 95.0, None, _metrics(0.1, 98.0, 2.0, 4, 6, 1), shaky_eps),
            _record("none", None, None, _metrics(None, None, None, None, None, None), [])]
    assert [r["name"] for r in latest_by_name(recs)] == ["safe", "shaky", "bold", "none"]
    # fewer episodes off the gate rank higher whatever the score: one failure at 50 above two at 95 and four at 90
    close_eps = [_ep("bench-a", 0, 50.0, gate=False)] + [_ep("bench-a", i, 50.0) for i in range(1, 6)]
    close = _record("close", 50.0, None, _metrics(0.5, 98.5, 1.5, 5, 6, 0), close_eps)
    assert [r["name"] for r in latest_by_name(recs + [close])] == ["safe", "close", "shaky", "bold", "none"]
    _write_jsonl(tmp_path / "results" / "dev.jsonl", recs)
    md = render_board(tmp_path)[0].read_text(encoding="utf-8")
    rows = {line.split(" | ")[1]: line.split(" | ") for line in md.splitlines() if line.startswith("| ") and
            line.split(" | ")[0] in ("| 1", "| 2", "| 3", "| 4")}
    assert [rows[n][0] for n in ("safe", "shaky", "bold", "none")] == ["| 1", "| 2", "| 3", "| 4"]
    # the gate failures column counts episodes that ran and failed; lost episodes have their own
    assert rows["bold"][5:7] == ["4 of 6", "0"]
    assert rows["safe"][5:7] == ["0 of 6", "0"]
    assert rows["shaky"][5:7] == ["1 of 6", "1 (timeout 1)"]
    assert render.RANKING + "." in md


def test_gate_columns_of_a_record_without_episode_rows() -> None:
    """An older or trimmed record: gate failures from metrics (episodes - passed), lost from metrics.failed."""
    rec = _record("old", 50.0, None, _metrics(0.1, 98.0, 2.0, 3, 6, 2), [])
    assert render._gate_failures(rec) == (3, 6) and render._lost(rec) == (2, "")
    rec["metrics"].update(gate_failures=1, lost=2)
    assert render._gate_failures(rec) == (1, 6)


def test_render_of_a_missing_board_is_one_clear_error(tmp_path: Path, capsys, monkeypatch) -> None:
    from commitenv.cli import main

    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 'nope'}: no such folder")):
        render_board(tmp_path / "nope")
    monkeypatch.chdir(tmp_path)  # outside a checkout: no ./leaderboard
    assert main(["leaderboard", "render"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: render: no ./leaderboard folder here") and "--board DIR" in lines[0]
    assert "Errno" not in err and "Traceback" not in err
    assert main(["leaderboard", "render", "--board", "nope"]) == 2
    assert "nope: no such folder" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    make_board(tmp_path / "leaderboard")
    assert main(["leaderboard", "render"]) == 0  # the default board where there is one
    assert (tmp_path / "leaderboard" / "LEADERBOARD.md").is_file()


def test_empty_board_says_no_results(tmp_path: Path) -> None:
    md_path, html_path = render_board(tmp_path)
    assert "No results yet." in md_path.read_text(encoding="utf-8")
    page = html_path.read_text(encoding="utf-8")
    assert "No results yet." in page and "<table" not in page
    assert render_markdown({}) == md_path.read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------- html (static)


class _Doc(HTMLParser):
    """Every start tag with its attributes, and the text inside each <td>."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.cells: list[str] = []
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "td":
            self._in_td, self._text = True, ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._in_td = False
            self.cells.append(self._text)

    def handle_data(self, data):
        if self._in_td:
            self._text += data


def _parse(page: str) -> _Doc:
    doc = _Doc()
    doc.feed(page)
    return doc


def _board_rows(page: str, suite: str) -> str:
    m = re.search(rf'<table class="board sortable" id="board-{suite}">(.*?)</table>', page, flags=re.S)
    assert m, f"no board-{suite} table"
    return m.group(1)


def test_html_table_rows_and_values(board: Path) -> None:
    _, html_path = render_board(board)
    page = html_path.read_text(encoding="utf-8")
    doc = _parse(_board_rows(page, "dev"))
    names = [a["data-name"] for t, a in doc.tags if t == "tr" and "data-name" in a]
    assert names == SCORE_ORDER  # the parser unescapes attributes: the raw hostile name round-trips
    keys = [a["data-key"] for t, a in doc.tags if t == "th"]
    assert keys == ["rank", "name", "score", "cost", "attainment", "gate_failures", "lost", "misses", "learns",
                    "authors", "commit", "submitted"]
    assert [a.get("aria-sort") for t, a in doc.tags if t == "th"][0] == "ascending"
    values = [a["data-value"] for t, a in doc.tags if t == "td"]
    per_row = [values[i:i + 12] for i in range(0, len(values), 12)]
    assert per_row[1][:8] == ["2", "epact", "70.5625", "0.01", "99.5", "0", "0", "120.0"]
    assert per_row[2][2:8] == ["5.0", "1.16", "97.0", "1", "1", "1000.0"]
    assert per_row[3][2:8] == ["", "", "", "", "", ""]  # nulls are empty, so they sort last
    assert render.NORMALIZATION.format(lower="vllm", upper="oracle") == NORMALIZATION
    assert NORMALIZATION in page


def test_html_escapes_user_text(board: Path) -> None:
    _, html_path = render_board(board)
    page = html_path.read_text(encoding="utf-8")
    assert "&lt;script&gt;window.__pwned=1&lt;/script&gt; | x" in page
    assert "&lt;img src=x onerror=&quot;window.__pwned=2&quot;&gt;" in page
    assert "window.__pwned=1</script>" not in page and "<img" not in page
    doc = _parse(page)
    assert [t for t, _ in doc.tags].count("script") == 1  # only the sorting script
    assert HOSTILE in doc.cells  # shown as text
    # self-contained: nothing fetched from anywhere
    assert not [(t, a) for t, a in doc.tags if t in ("link", "img", "iframe") or "src" in a or "href" in a]
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in page


def test_csp_allows_exactly_the_page_script(board: Path) -> None:
    """The page's CSP lets only its own inline script run, by hash; a wrong hash would silently disable sorting."""
    import base64
    import hashlib

    page = render_board(board)[1].read_text(encoding="utf-8")
    body = re.search(r"<script>(.*?)</script>", page, flags=re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(body.encode("utf-8")).digest()).decode("ascii")
    csp = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]*)">', page).group(1)
    assert f"script-src &#x27;sha256-{digest}&#x27;" in csp and "default-src &#x27;none&#x27;" in csp


def test_html_breakdown_and_scatter(board: Path) -> None:
    _, html_path = render_board(board)
    page = html_path.read_text(encoding="utf-8")
    m = re.search(r'<table class="breakdown sortable" id="breakdown-dev">(.*?)</table>', page, flags=re.S)
    assert m
    doc = _parse(m.group(1))
    assert doc.cells == [HOSTILE, "87.5", "72.5", "epact", "71.1", "70.0", "fixed", "5.0", "5.0", "broken", "—", "—"]
    svg = re.search(r'<svg class="scatter" id="scatter-dev".*?</svg>', page, flags=re.S).group(0)
    # x ticks 0..1.5 (step 0.5) over x = 70..610; y ticks 97..99.5 (step 0.5) over y = 350..20
    points = re.findall(r'<g class="point" data-name="([^"]*)"><circle cx="([\d.]+)" cy="([\d.]+)"', svg)
    assert points == [("&lt;script&gt;window.__pwned=1&lt;/script&gt; | x", "77.2", "185.0"),
                      ("epact", "73.6", "20.0"), ("fixed", "487.6", "350.0")]  # broken has nothing to plot
    ticks = re.findall(r'text-anchor="(?:middle|end)">([\d.]+)</text>', svg)
    assert ticks == ["0.0", "0.5", "1.0", "1.5", "97.0", "97.5", "98.0", "98.5", "99.0", "99.5"]
    assert "mean cost (kWh-eq" in svg and "mean SLO attainment (%)" in svg


# ---------------------------------------------------------------------------------------------------- atomic writes


def _listing(path: Path) -> set[str]:
    return {p.name for p in path.iterdir()}


def test_failed_render_keeps_old_board(board: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md_path, html_path = render_board(board)
    old_md, old_html = md_path.read_bytes(), html_path.read_bytes()
    _write_jsonl(board / "results" / "dev.jsonl", dev_records()[:2])  # the board would change

    def boom(results):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(render, "render_html", boom)
    with pytest.raises(RuntimeError, match="rendering failed"):
        render_board(board)
    assert md_path.read_bytes() == old_md and html_path.read_bytes() == old_html
    assert _listing(board) == {"results", "LEADERBOARD.md", "index.html"}


def test_failed_write_leaves_no_temp_file(board: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    md_path, _ = render_board(board)
    old_md = md_path.read_bytes()
    _write_jsonl(board / "results" / "dev.jsonl", dev_records()[:2])

    def refuse(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        render_board(board)
    assert md_path.read_bytes() == old_md
    assert _listing(board) == {"results", "LEADERBOARD.md", "index.html"}


def test_render_functions_match_files(board: Path) -> None:
    md_path, html_path = render_board(board)
    results = load_results(board / "results")
    assert md_path.read_text(encoding="utf-8") == render_markdown(results)
    assert html_path.read_text(encoding="utf-8") == render_html(results)


# ---------------------------------------------------------------------------------------------------- browser

LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser_page_url(tmp_path_factory: pytest.TempPathFactory):
    """One headless Chromium for the module, and the file:// URL of a rendered board."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found (Debian: apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (pip install playwright)")
    _, html_path = render_board(make_board(tmp_path_factory.mktemp("board")))
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=LAUNCH_ARGS)
        try:
            yield browser, html_path.as_uri()
        finally:
            browser.close()


@pytest.fixture
def page(browser_page_url):
    browser, url = browser_page_url
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url)
    yield page
    page.close()
    assert errors == []  # no JS error, no CSP violation


def _row_names(page, table: str = "#board-dev") -> list[str]:
    return page.eval_on_selector_all(f"{table} tbody tr", "rows => rows.map(r => r.dataset.name)")


def _sorted_headers(page) -> dict[str, str]:
    js = "hs => Object.fromEntries(hs.map(h => [h.dataset.key, h.getAttribute('aria-sort')]))"
    return page.eval_on_selector_all("#board-dev thead th[aria-sort]", js)


def test_browser_rows_in_score_order(page) -> None:
    assert _row_names(page) == SCORE_ORDER
    assert _sorted_headers(page) == {"rank": "ascending"}
    assert _row_names(page, "#breakdown-dev") == SCORE_ORDER


def test_browser_click_sorts_by_cost(page) -> None:
    page.click('#board-dev th[data-key="cost"]')
    assert _row_names(page) == ["epact", HOSTILE, "fixed", "broken"]  # 0.01 < 0.02 < 1.16, null last
    assert _sorted_headers(page) == {"cost": "ascending"}
    page.click('#board-dev th[data-key="cost"]')
    assert _row_names(page) == ["fixed", HOSTILE, "epact", "broken"]
    assert _sorted_headers(page) == {"cost": "descending"}
    page.click('#board-dev th[data-key="score"]')
    assert _row_names(page) == ["fixed", "epact", HOSTILE, "broken"]
    assert _sorted_headers(page) == {"score": "ascending"}
    page.click('#breakdown-dev th[data-key="bench-a"]')  # 87.5, 71.125, 5.0, none
    assert _row_names(page, "#breakdown-dev") == ["fixed", "epact", HOSTILE, "broken"]
    assert _row_names(page) == ["fixed", "epact", HOSTILE, "broken"]  # the other table is left alone


def test_browser_hostile_name_is_text(page) -> None:
    cell = page.locator('#board-dev tbody tr[data-rank="1"] td').nth(1)
    assert cell.inner_text().splitlines() == [HOSTILE, HOSTILE_DESC]
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.locator("img").count() == 0
    assert page.locator("script").count() == 1
