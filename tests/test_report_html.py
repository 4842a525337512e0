"""`snakemake --report` of the finished smoke run, rendered in headless Chromium: its main page
shows report.md (every table cell, heading and hash, figures inlined), every result has a
caption, and a screenshot of the page is a real picture.

Needs a Chromium binary (Debian: `apt-get install chromium`; .ci/run installs it); skipped
without one."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image

from plantbench.markdown import method_label
from plantbench.report.html import markdown_html

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SHOT_SIZE = (1280, 900)
FIGURES = {
    "loss_curves.png",
    "reading_curve.png",
    "learned_rate.png",
    "ap_by_n_docs.png",
    "mass_vs_effect.png",
    "mass_raw_scatter.png",
    "context_shift.png",
    "context_ssp.png",
    "grounding_ck.png",
    "grounding_cr.png",
    "membership_layers.png",
}
TABLES = {"retrieval.csv", "correlations.csv", "learned_grid.csv"}


@pytest.fixture(scope="module")
def browser() -> str:
    found = os.environ.get("CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if not found:
        pytest.skip(f"no Chromium binary (none of {', '.join(BROWSERS)} on PATH, no $CHROMIUM)")
    return found


@pytest.fixture(scope="module")
def report_html(smoke_run: Path, plugin_config: Path, tmp_path_factory) -> Path:
    from smokerun import snakemake

    out = tmp_path_factory.mktemp("snakemake report") / "report.html"
    proc = snakemake(smoke_run, "--report", str(out), configfiles=(str(plugin_config),))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def chromium(browser: str, page: Path | str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on a file (a Path) or a URL (a str), with ``args``."""
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'profile'}",
        "--virtual-time-budget=20000",
        *args,
        page if isinstance(page, str) else page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


class Page(HTMLParser):
    """The visible text of a DOM (scripts and styles left out): its table rows, headings and
    images."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self.headings: list[str] = []
        self.images: list[str] = []
        self.text: list[str] = []
        self._skip = 0
        self._cell: list[str] | None = None
        self._heading: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style"):
            self._skip += 1
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []
        elif tag in ("h1", "h2", "h3"):
            self._heading = []
        elif tag == "img":
            self.images.append(dict(attrs).get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style"):
            self._skip -= 1
        elif tag in ("td", "th") and self._cell is not None and self.tables:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag in ("h1", "h2", "h3") and self._heading is not None:
            self.headings.append(" ".join("".join(self._heading).split()))
            self._heading = None

    @property
    def rows(self) -> list[list[str]]:
        return [r for t in self.tables for r in t if r]

    def table(self, column: str) -> list[list[str]]:
        """The rows of the one table with ``column`` in its header."""
        (found,) = [t for t in self.tables if t and column in t[0]]
        return found

    def handle_data(self, data: str) -> None:
        if self._skip:
            return
        self.text.append(data)
        for part in (self._cell, self._heading):
            if part is not None:
                part.append(data)


def parse(html: str) -> Page:
    page = Page()
    page.feed(html)
    return page


def md_cells(md: str) -> list[list[str]]:
    """report.md's table rows (separator rows left out), code spans as their text."""
    rows = []
    for line in md.splitlines():
        if line.startswith("|") and not set(line) <= set("|-: "):
            cells = line.strip().strip("|").split("|")
            rows.append([" ".join(c.replace("`", "").split()) for c in cells])
    return rows


def test_markdown_html_keeps_every_block(tmp_path: Path) -> None:
    """Headings, paragraphs, tables, lists, code spans and images of report.md's markdown,
    HTML-escaped, the image inlined byte for byte (no browser needed)."""
    png = b"\x89PNG\r\n\x1a\n" + bytes(range(256))
    (tmp_path / "fig.png").write_bytes(png)
    md = (
        "# Title\n\nA <b> & `code`\nspan.\n\n## Table\n\n| Method | AP |\n|---|---|\n"
        "| BM25 `x` | 0.995 |\n| a<b | n/a |\n\n![a figure](fig.png)\n\n- one\n- two\n"
    )
    out = markdown_html(md, tmp_path)
    page = parse(out)
    assert page.rows == md_cells(md) == [["Method", "AP"], ["BM25 x", "0.995"], ["a<b", "n/a"]]
    assert page.headings == ["Title", "Table"]
    assert "<p>A &lt;b&gt; &amp; <code>code</code> span.</p>" in out
    assert "<ul><li>one</li><li>two</li></ul>" in out
    (src,) = page.images
    assert base64.b64decode(src.removeprefix("data:image/png;base64,")) == png
    assert markdown_html(md, tmp_path) == out


@pytest.fixture(scope="module")
def rendered(browser: str, report_html: Path, tmp_path_factory) -> Page:
    tmp = tmp_path_factory.mktemp("chromium dom")
    return parse(chromium(browser, report_html, tmp, "--dump-dom").stdout)


def test_the_page_is_rendered_by_its_javascript(report_html: Path, rendered: Page) -> None:
    """The tables exist only in the rendered DOM (the file holds them as a JS string)."""
    static = parse(report_html.read_text())
    assert not static.rows, "the report file already has table rows"
    assert len(rendered.rows) > 20


def test_main_page_holds_everything_report_md_holds(smoke_run: Path, rendered: Page) -> None:
    md = (smoke_run / "report" / "report.md").read_text()
    shown = {tuple(r) for r in rendered.rows}
    missing = [r for r in md_cells(md) if tuple(r) not in shown]
    assert not missing, f"rows of report.md not on the report's page: {missing[:3]}"
    lines = md.splitlines()
    headings = [x.lstrip("#").strip().replace("`", "") for x in lines if x.startswith("#")]
    assert len(headings) > 5 and set(headings) <= set(rendered.headings)
    figures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert set(figures) == FIGURES
    pngs = [s for s in rendered.images if s.startswith("data:image/png;base64,")]
    assert len(pngs) >= len(figures)


def _row_of(table: list[list[str]], method: str) -> list[str]:
    label = method_label(method)
    (row,) = [r for r in table[1:] if r[0] == label or r[0].startswith(f"{label} (")]
    return row


def test_retrieval_and_correlation_tables_are_on_the_page(smoke_run: Path, rendered: Page) -> None:
    ret = pd.read_csv(smoke_run / "analysis" / "retrieval.csv", keep_default_na=False)
    corr = pd.read_csv(smoke_run / "analysis" / "correlations.csv", keep_default_na=False)
    retrieval = rendered.table("Recall@10")
    assert retrieval[0][:3] == ["Method", "AP, model A", "AP, model B"]
    assert len(retrieval) == 1 + ret["method"].nunique()
    for method in ret["method"].unique():
        ap_a = float(ret[(ret["method"] == method) & (ret["model"] == "A")]["ap"].iloc[0])
        assert _row_of(retrieval, method)[1] == f"{ap_a:.3f}", method
    correlations = rendered.table("vs causal effect, controlled")
    assert len(correlations) == 1 + len(corr)
    for _, c in corr.iterrows():
        row = _row_of(correlations, c["method"])
        if c["raw"] != "":
            assert row[1].startswith(f"{float(c['raw']):+.2f} ["), (c["method"], row)
    hashes = dict(r for r in rendered.table("xxh3-128")[1:])
    for name, folder in (("causal", "causal"), ("analysis", "analysis"), ("model A", "models/A")):
        assert hashes[name] == json.loads((smoke_run / folder / "meta.json").read_text())["hash"]


def test_every_result_is_captioned(report_html: Path) -> None:
    text = report_html.read_text()
    data = re.search(r"var results = (\{.*?\});\s*</script>", text, re.S)
    assert data, "no results object in the report"
    results = json.loads(data.group(1))
    names = {r["name"] for r in results.values()}
    assert names >= FIGURES | TABLES | {"report.html"}
    uncaptioned = sorted(r["name"] for r in results.values() if len(r["caption"].strip()) < 40)
    assert not uncaptioned, f"results without a caption: {uncaptioned}"


def test_screenshot_of_the_main_page(browser: str, report_html: Path, tmp_path: Path) -> None:
    shot = tmp_path / "report.png"
    chromium(
        browser, report_html, tmp_path, f"--window-size={SHOT_SIZE[0]},{SHOT_SIZE[1]}",
        f"--screenshot={shot}",
    )  # fmt: skip
    with Image.open(shot) as img:
        size, pixels = img.size, img.convert("RGB")
        colours = pixels.getcolors(maxcolors=1 << 20) or []
    assert size == SHOT_SIZE
    assert len(colours) > 200, f"only {len(colours)} distinct pixel values: a blank page?"
    background = max(colours)[0] / (SHOT_SIZE[0] * SHOT_SIZE[1])
    assert background < 0.9, f"{background:.0%} of the page is one colour"
