"""The documentation site as a reader sees it: built once (`mkdocs build --strict`), then read as
HTML and, where Debian's `chromium` is installed, loaded in a headless browser.

On the built HTML: no `>>>` outside a code block, no API page with more than 40 objects, no
benchmark table wider than 10 columns or with an empty cell, no path of any machine, and the math
assets served from the site itself. In the browser (tests/_docs_browser.html, served beside the
site on 127.0.0.1): no console message, the math typeset by KaTeX with no raw `\\(` left, every
image loaded (natural width > 0), and the search box answering "epsilon". Without chromium the
browser test skips and says so; .ci/run installs it.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import os
import pathlib
import re
import shutil
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs"))
bench_pages = pytest.importorskip("bench_pages")
pytest.importorskip("mkdocs")
pytest.importorskip("material")

MAX_OBJECTS_PER_API_PAGE = 40
MAX_BENCH_COLUMNS = 10
CODE_COLUMN = 88


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> pathlib.Path:
    out = tmp_path_factory.mktemp("site") / "site"
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                         capture_output=True, text=True, env={**_env(), "NO_MKDOCS_2_WARNING": "1"}, timeout=600)
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{run.stderr[-5000:]}"
    return out


def _env():
    return {k: v for k, v in os.environ.items() if k != "REPCAP_BACKEND"}


def _pages(site: pathlib.Path, under: str = "") -> list[pathlib.Path]:
    return sorted((site / under).rglob("index.html")) if under else sorted(site.rglob("*.html"))


def _prose(page_html: str) -> str:
    """The HTML without its code blocks and inline code."""
    text = re.sub(r"<pre\b.*?</pre>", "", page_html, flags=re.S)
    return re.sub(r"<code\b.*?</code>", "", text, flags=re.S)


def test_no_doctest_prompt_outside_a_code_block(site):
    bad = [p.relative_to(site).as_posix() for p in _pages(site) if "&gt;&gt;&gt;" in _prose(p.read_text())]
    assert not bad, f"`>>>` outside a code block (an Examples: section griffe did not parse?) in {bad}"
    api = (site / "api" / "repcap_fast" / "index.html").read_text()
    assert '<span class="gp">&gt;&gt;&gt; </span>' in api  # the examples are there, as highlighted code


def test_api_pages_are_split_by_topic(site):
    counts = {p.parent.name: p.read_text().count('class="doc doc-heading') for p in _pages(site, "api")}
    assert sum(counts.values()) > 150
    big = {page: n for page, n in counts.items() if n > MAX_OBJECTS_PER_API_PAGE}
    assert not big, f"API pages with more than {MAX_OBJECTS_PER_API_PAGE} objects: {big}"


def test_returns_are_one_item_without_a_repeated_type(site):
    api = (site / "api" / "repcap_fast" / "index.html").read_text()
    section = api[api.index('id="repcap_fast.pairwise_cosine_stats"'):]
    returns = section[section.index("Returns:"):section.index("Raises:")]
    assert returns.count("doc-section-item") == 1, "the Returns section is split into several rows"
    assert "<th>Name</th>" not in returns


def _tables(page_html: str):
    for table in re.findall(r"<table\b.*?</table>", page_html, flags=re.S):
        header = re.findall(r"<th\b", table)
        rows = [re.findall(r"<td\b[^>]*>(.*?)</td>", row, flags=re.S)
                for row in re.findall(r"<tr\b.*?</tr>", table, flags=re.S)]
        yield len(header), [r for r in rows if r]


def test_benchmark_pages_lead_with_plots_and_compact_tables(site):
    overview = (site / "benchmarks" / "index.html").read_text()
    for op in bench_pages.OPS:
        if bench_pages.records(op):
            assert f'src="plots/{op}.png"' in overview
            assert (site / "benchmarks" / "plots" / f"{op}.png").stat().st_size > 10_000
    n_tables = 0
    for page in _pages(site, "benchmarks"):
        for width, rows in _tables(page.read_text()):
            n_tables += 1
            assert width <= MAX_BENCH_COLUMNS, f"{page}: a table of {width} columns"
            for row in rows:
                assert all(re.sub(r"<[^>]+>", "", c).strip() for c in row), f"{page}: an empty cell in {row}"
    assert n_tables >= 4
    assert "Not tabulated here" not in overview


def test_no_page_and_no_result_file_shows_a_path_of_a_machine(site):
    found = {}
    for page in _pages(site):
        paths = bench_pages.machine_paths(html.unescape(page.read_text()))
        if paths:
            found[page.relative_to(site).as_posix()] = paths[:3]
    for path in [*sorted((ROOT / "bench" / "results").rglob("*.json")), *sorted((ROOT / "docs").rglob("*.md")),
                 *sorted((ROOT / "docs" / "gallery").glob("*.json"))]:
        paths = bench_pages.machine_paths(path.read_text(encoding="utf-8"))
        if paths:
            found[path.relative_to(ROOT).as_posix()] = paths[:3]
    assert not found, f"paths of a machine: {found}"


def test_the_machine_path_check_can_fail():
    assert bench_pages.machine_paths('{"plot": "/work/main/bench/results/x.png"}') == ["/work/main/bench/results/x.png"]
    assert bench_pages.machine_paths("see bench/results/x.png and https://example.org/tmp/x") == []


def test_math_is_typeset_from_the_site_itself(site):
    pages = [p for p in _pages(site) if 'class="arithmatex"' in p.read_text()]
    names = {p.relative_to(site).parent.as_posix() for p in pages}
    assert {"concepts", "guides/capacity", "guides/pga", "guides/packing"} <= names
    for page in pages:
        text = page.read_text()
        scripts = re.findall(r'<script src="([^"]+)"', text)
        assert any(s.endswith("assets/katex/katex.min.js") and not s.startswith("http") for s in scripts), page
    fonts = list((site / "assets" / "katex" / "fonts").glob("*.woff2"))
    assert len(fonts) >= 20


def _fences(text: str):
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", text, flags=re.S | re.M):
        yield text.count("\n", 0, m.start()) + 1, m.group(2)


def test_code_lines_fit_the_code_column():
    long = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for line0, body in _fences(page.read_text(encoding="utf-8")):
            for i, line in enumerate(body.splitlines(), line0 + 1):
                if len(line) > CODE_COLUMN:
                    long.append(f"{page.relative_to(ROOT)}:{i} ({len(line)})")
    assert not long, f"code lines over {CODE_COLUMN} characters: {long}"


# ---------------------------------------------------------------- in a browser

BROWSER_PAGES = ["", "concepts/", "guides/pga/", "api/repcap_fast/", "api/repcap_fast-penalty/", "api/capacity/",
                 "api/packing/", "api/pga/", "benchmarks/", "benchmarks/cpu/"]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the site; /_sleep?ms=N answers after N ms of real time (tests/_docs_browser.html)."""

    def do_GET(self):  # noqa: N802 -- the http.server hook name
        if self.path.startswith("/_sleep"):
            ms = int(urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("ms", ["100"])[0])
            time.sleep(min(ms, 5000) / 1000)
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):  # silence the server's access log
        pass


@pytest.fixture(scope="module")
def served(site):
    shutil.copy(ROOT / "tests" / "_docs_browser.html", site / "_browser_check.html")
    handler = functools.partial(_Quiet, directory=str(site))
    with socketserver.ThreadingTCPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()


def test_the_site_in_a_browser(served, tmp_path):
    chromium = _chromium()
    if chromium is None:
        if os.environ.get("REPCAP_REQUIRE_BROWSER") == "1":  # set by .ci/run, which installs chromium
            pytest.fail("chromium is not installed, and REPCAP_REQUIRE_BROWSER=1 asks for the browser test")
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    query = json.dumps(BROWSER_PAGES)
    url = f"{served}/_browser_check.html#{query}"
    run = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                          "--disable-background-networking", "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--log-level=0",
                          "--window-size=1280,2000", "--virtual-time-budget=60000", "--dump-dom", url],
                         capture_output=True, text=True, timeout=300)
    found = re.search(r'<pre id="result">(.*?)</pre>', run.stdout, flags=re.S)
    assert found, f"the check page did not finish:\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    result = json.loads(html.unescape(found.group(1)))
    console = [line for line in run.stderr.splitlines() if ":CONSOLE" in line and served in line]
    assert not console, "console messages:\n" + "\n".join(console)
    for page in BROWSER_PAGES:
        r = result["pages"][page]
        assert r["loaded"], f"{page or 'home'} did not load"
        assert not r["broken_images"], f"{page}: images that did not load: {r['broken_images']}"
        assert not r["raw_math"], f"{page}: math left untypeset: {r['raw_math'][:3]}"
        assert r["arithmatex"] == r["typeset"], f"{page}: not typeset: {r['untypeset']}"
    assert result["pages"]["concepts/"]["typeset"] >= 20 and result["pages"]["guides/pga/"]["typeset"] >= 1
    assert result["pages"]["benchmarks/"]["images"] >= 3
    assert result["search_results"] > 0, "the search box found nothing for 'epsilon'"
