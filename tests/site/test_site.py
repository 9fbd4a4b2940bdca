"""The course's site (``make site``: tools/build_site.py), built once for the module from the committed notebooks
with no network, then read as a person would in headless Chromium.

The module's site is built into a temporary folder with the network cut: in a network namespace of its own where
``unshare -n`` works (root on Linux), else with Python's sockets refusing every connection and name look-up. Its
pages are served by a local http.server on loopback. Without a browser: a page for every lesson, exercise, the
course map and each guide page, no solution, every figure a lesson stores on its page, the links between notebooks
turned into links between pages; a link to a repository file shown as its path and a JupyterLab-spelled anchor
resolved (a small repository of its own). In the browser (``browser``): every page reached from the front page by
its links loads with no console error and asks nothing of another machine, every image has a size, every table
renders, no internal link (page or anchor) is broken; the search finds "reduce-scatter"; every lesson at a phone's
width (390 px) is no wider than the screen. Skipped, with the command that installs them, where Sphinx and myst-nb
(the ``site`` extra) or Chromium and playwright are missing.
"""
from __future__ import annotations

import functools
import http.server
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # tools/ is not a package: its modules import one another by name
build_site = importlib.import_module("build_site")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")  # the fixture: tests/conftest.py
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = sorted((ROOT / "exercises").glob("*.ipynb"))
GUIDES = sorted((ROOT / "docs").glob("*.md"))
PHONE = {"width": 390, "height": 844}


def _sphinx_missing() -> str | None:
    missing = [m for m in ("sphinx", "myst_nb", "sphinx_book_theme") if importlib.util.find_spec(m) is None]
    return f"{', '.join(missing)} not installed (pip install -e '.[site]')" if missing else None


def _browser_missing() -> str | None:
    if CHROMIUM is None:
        return "Chromium is not installed (Debian: apt-get install -y chromium)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright; it drives the system Chromium)"
    return _sphinx_missing()


def _no_network_namespace() -> bool:
    """True where ``unshare -n`` can give a process a network of its own (root on Linux)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--net", "--", "true"], capture_output=True).returncode == 0


needs_sphinx = pytest.mark.skipif(_sphinx_missing() is not None, reason=_sphinx_missing() or "")
needs_browser = pytest.mark.skipif(_browser_missing() is not None, reason=_browser_missing() or "")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The course's site, built once for the module with no network."""
    if _sphinx_missing():
        pytest.skip(_sphinx_missing())
    work = tmp_path_factory.mktemp("site")
    return build_site.build(work / "out", work / "work",
                            network="none" if _no_network_namespace() else "refuse")


@pytest.fixture(scope="module")
def served(site):
    """The site on a local http.server (loopback), shared by the module's browser tests; always stopped."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site.out)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _page(out: Path, source: Path) -> Path:
    return out / source.relative_to(ROOT).with_suffix(".html")


@needs_sphinx
def test_every_lesson_exercise_and_guide_is_a_page_and_no_solution_is(site):
    for source in [*LESSONS, *EXERCISES, *GUIDES, ROOT / "notebooks" / "README.md"]:
        page = _page(site.out, source)
        assert page.exists(), f"no page for {source.relative_to(ROOT)}"
        title, text = build_site._page_title(source), page.read_text()
        assert all(word in text for word in re.findall(r"\w{3,}", title)[:4]), (source.name, title)
    assert len(LESSONS) == 18 and len(EXERCISES) >= 17
    assert not (site.out / "solutions").exists()
    assert all("solutions" not in p.relative_to(site.out).parts for p in site.out.rglob("*"))
    assert not (site.out / "_sources").exists() and not (site.out / ".doctrees").exists()
    assert site.pages >= len(LESSONS) + len(EXERCISES) + len(GUIDES) + 3  # index, interview, search


@needs_sphinx
def test_every_figure_a_lesson_stores_is_on_its_page_and_no_cell_ran(site):
    for lesson in LESSONS:
        notebook = json.loads(lesson.read_text())
        stored = [o for c in notebook["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
        page = _page(site.out, lesson).read_text()
        images = re.findall(r'<img [^>]*src="(\.\./_images/[^"]+)"', page)
        assert len(images) >= len(stored), lesson.name
        assert all((site.out / "notebooks" / src).resolve().stat().st_size > 0 for src in images)
        # the outputs are the committed ones: the first printed line of every cell that printed one is on the page
        for cell in notebook["cells"]:
            for output in cell.get("outputs", []):
                if output.get("output_type") == "stream":
                    first = next((line for line in "".join(output["text"]).splitlines() if line.strip()), "")
                    words = re.findall(r"[A-Za-z]{4,}", first)[:3]
                    assert all(w in page for w in words), (lesson.name, first)


@needs_sphinx
def test_links_between_notebooks_are_links_between_pages(site):
    course_map = (site.out / "notebooks" / "README.html").read_text()
    assert 'href="../exercises/02_naive_ddp.html"' in course_map
    assert 'href="02_training_memory.html"' in course_map
    lesson = (site.out / "notebooks" / "03_data_parallel.html").read_text()
    assert 'href="../exercises/02_naive_ddp.html"' in lesson and 'href="04_zero1.html"' in lesson
    assert ".ipynb\"" not in course_map and ".ipynb#" not in lesson


@needs_sphinx
def test_the_interview_page_links_each_question_to_its_cell(site):
    page = (site.out / "interview.html").read_text()
    lessons = {path.name[:2]: path for path in LESSONS}
    links = re.findall(r'href="notebooks/(\d\d)_[a-z_0-9]+\.html#(interview-(\d\d)-(\d))"', page)
    assert {(n, q) for _, _, n, q in links} == {
        (n, str(q.number)) for n, path in lessons.items() for q in build_site.site_interview.lesson_questions(path, ROOT)}
    for lesson, anchor, _, _ in links:  # the anchor is an element of the lesson's page
        assert f'id="{anchor}"' in _page(site.out, lessons[lesson]).read_text(), anchor


@needs_sphinx
def test_a_link_to_a_repository_file_is_its_path_and_a_jupyterlab_anchor_reaches_its_heading(tmp_path):
    """A repository of its own: a lesson, the map, an exercise, a guide that links a source file, a solution, a
    heading by JupyterLab's spelling and by GitHub's."""
    repository = tmp_path / "repository"
    for folder in ("notebooks", "exercises", "docs", "solutions", "zerokit"):
        (repository / folder).mkdir(parents=True)

    def notebook(*sources: str) -> str:
        return json.dumps({"cells": [{"cell_type": "markdown", "id": f"c{i}", "metadata": {}, "source": s}
                                     for i, s in enumerate(sources)],
                           "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}},
                           "nbformat": 4, "nbformat_minor": 5})

    (repository / "notebooks" / "00_first.ipynb").write_text(notebook(
        "# 00 · First\n\nA lesson.", "## Why gloo's times are not a ring's\n\nBecause.",
        "## Interview questions\n\n1. *Why?*\n\n   <details><summary>Answer</summary>\n\n   Because.\n\n"
        "   </details>\n\n2. *How?*\n\n   <details><summary>Answer</summary>\n\n   So.\n\n   </details>\n"))
    (repository / "notebooks" / "README.md").write_text("# The course\n\nOne lesson: [00](00_first.ipynb).\n")
    (repository / "exercises" / "01_one.ipynb").write_text(notebook(
        "# Exercise 01\n\nSee [the solution](../solutions/01_one.ipynb) and "
        "[lesson 00's heading](../notebooks/00_first.ipynb#Why-gloo's-times-are-not-a-ring's)."))
    (repository / "solutions" / "01_one.ipynb").write_text(notebook("# Solution"))
    (repository / "zerokit" / "theory.py").write_text("")
    (repository / "docs" / "guide.md").write_text(
        "# A guide\n\nThe formulas live in [zerokit/theory.py](../zerokit/theory.py); "
        "[the same heading](../notebooks/00_first.ipynb#why-gloos-times-are-not-a-rings).\n")
    built = build_site.build(tmp_path / "out", tmp_path / "work", repository=repository, network="refuse")
    exercise = (built.out / "exercises" / "01_one.html").read_text()
    assert "<code class=\"docutils literal notranslate\"><span class=\"pre\">solutions/01_one.ipynb</span></code>" \
        ", in the repository)" in exercise
    assert 'href="../notebooks/00_first.html#why-gloo-s-times-are-not-a-ring-s"' in exercise
    guide = (built.out / "docs" / "guide.html").read_text()
    assert "zerokit/theory.py</span></code> (in the repository)" in guide
    assert 'href="../notebooks/00_first.html#why-gloo-s-times-are-not-a-ring-s"' in guide
    (repository / "docs" / "guide.md").write_text("# A guide\n\n[Gone](../zerokit/gone.py).\n")
    with pytest.raises(RuntimeError, match="gone.py"):  # a link to nothing fails the build
        build_site.build(tmp_path / "out", tmp_path / "work", repository=repository, network="refuse")


def test_a_build_that_reaches_for_the_network_fails():
    result = subprocess.run(
        [sys.executable, "-c", build_site._REFUSE_NETWORK.replace(
            "from sphinx.cmd.build import main", "import urllib.request; urllib.request.urlopen('http://192.0.2.1/')")],
        capture_output=True, text=True)
    assert result.returncode != 0 and "reached for the network" in result.stderr


#: every check of one page, run in it: images with a size, tables with rows, no markdown table left as text, the
#: page's ids and links
_PAGE_JS = """() => {
  const closed = e => { for (let p = e.parentElement; p; p = p.parentElement)
                          if (p.tagName === 'DETAILS' && !p.open) return true; return false; };
  const images = [...document.images].map(i => ({src: i.currentSrc || i.src, complete: i.complete,
                                                  width: i.naturalWidth, height: i.naturalHeight}));
  const tables = [...document.querySelectorAll('article table')].map(t => ({
      rows: t.querySelectorAll('tr').length, cells: t.querySelectorAll('td, th').length,
      shown: closed(t) || t.getBoundingClientRect().height > 0}));
  const leftAsText = [...document.querySelectorAll('article p')].map(p => p.textContent)
      .filter(text => /\\|\\s*:?-{3,}/.test(text));
  const ids = [...document.querySelectorAll('[id]')].map(e => e.id);
  const links = [...document.querySelectorAll('a[href]')].map(a => a.href);
  return {images, tables, leftAsText, ids, links};
}"""


def _visit(context, url: str):
    """Open ``url`` in a fresh page of ``context``; returns the page and the errors it met: console errors,
    uncaught exceptions, failed requests, responses of 400 and up, requests to any other machine."""
    page = context.new_page()
    errors: list[str] = []
    origin = urllib.parse.urlsplit(url).netloc
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"uncaught: {e}"))
    page.on("requestfailed", lambda r: errors.append(f"failed: {r.url} ({r.failure})"))
    page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.on("request", lambda r: errors.append(f"asked another machine: {r.url}")
            if urllib.parse.urlsplit(r.url).scheme in ("http", "https", "ws", "wss")
            and urllib.parse.urlsplit(r.url).netloc != origin else None)
    page.goto(url, wait_until="load")
    return page, errors


@pytest.mark.browser
@pytest.mark.slow
@needs_browser
def test_every_page_reached_from_the_front_page_loads_whole_with_no_broken_link(site, served, chromium):
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        to_visit, seen, ids, linked = [f"{served}/index.html"], set(), {}, []
        problems: list[str] = []
        while to_visit:
            url = to_visit.pop()
            if url in seen:
                continue
            seen.add(url)
            page, errors = _visit(context, url)
            found = page.evaluate(_PAGE_JS)
            page.close()
            name = url[len(served):]
            problems += [f"{name}: {e}" for e in errors]
            problems += [f"{name}: image {i['src']} has no size" for i in found["images"]
                         if not i["complete"] or i["width"] == 0 or i["height"] == 0]
            problems += [f"{name}: a table with no rows or cells, or not shown" for t in found["tables"]
                         if t["rows"] == 0 or t["cells"] == 0 or not t["shown"]]
            problems += [f"{name}: a markdown table left as text: {text[:80]!r}" for text in found["leftAsText"]]
            ids[url] = set(found["ids"])
            for link in found["links"]:
                parts = urllib.parse.urlsplit(link)
                if f"{parts.scheme}://{parts.netloc}" != served:
                    continue
                target = urllib.parse.urlunsplit(parts._replace(fragment="", query=""))
                linked.append((name, target, urllib.parse.unquote(parts.fragment)))
                if target.endswith(".html") and target not in seen:
                    to_visit.append(target)
        for name, target, fragment in linked:
            path = site.out / urllib.parse.unquote(urllib.parse.urlsplit(target).path).lstrip("/")
            if not path.is_file():
                problems.append(f"{name}: a link to {target}, which the site does not have")
            elif fragment and target in ids and fragment not in ids[target]:
                problems.append(f"{name}: a link to {target}#{fragment}, an anchor that page does not have")
        assert not problems, "\n".join(sorted(set(problems))[:40])
        pages = {urllib.parse.urlsplit(u).path for u in seen}
        for source in [*LESSONS, *EXERCISES, *GUIDES]:
            assert "/" + source.relative_to(ROOT).with_suffix(".html").as_posix() in pages, \
                f"{source.name}: no link from the front page reaches it"
        assert "/interview.html" in pages
    finally:
        context.close()


@pytest.mark.browser
@pytest.mark.slow
@needs_browser
def test_the_search_finds_reduce_scatter(served, chromium):
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        page, errors = _visit(context, f"{served}/search.html?q=reduce-scatter")
        page.wait_for_selector("#search-results ul.search li", timeout=30_000)
        results = page.eval_on_selector_all("#search-results ul.search li a", "links => links.map(a => a.href)")
        assert any("01_collectives.html" in r for r in results), results
        assert not errors, errors
    finally:
        context.close()


@pytest.mark.browser
@pytest.mark.slow
@needs_browser
def test_every_lesson_fits_a_phones_width(served, chromium):
    """At 390 px the page is no wider than the screen: long names wrap, code and wide tables scroll in their box."""
    context = chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        too_wide = []
        for source in [*LESSONS, ROOT / "notebooks" / "README.md"]:
            page, errors = _visit(context, f"{served}/{source.relative_to(ROOT).with_suffix('.html').as_posix()}")
            width, screen = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            page.close()
            assert not errors, errors
            if width > screen:
                too_wide.append(f"{source.name}: {width} px wide on a {screen} px screen")
        page, _ = _visit(context, f"{served}/interview.html")
        width, screen = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
        too_wide += [f"interview.html: {width} px wide on a {screen} px screen"] if width > screen else []
        assert not too_wide, "\n".join(too_wide)
    finally:
        context.close()
