"""Build the course's static site, ``build/site/``, from the committed notebooks: ``make site``.

Lifecycle:

1. the pages: every lesson (``notebooks/NN_*.ipynb``), the course map (``notebooks/README.md``), every exercise
   (``exercises/*.ipynb``; ``solutions/`` never), every guide page (``docs/*.md``, with whatever else ``docs/``
   holds: its pictures);
2. staged, in the repository's own layout, into ``<work>/src`` (so a link between them, ``../exercises/…``, is the
   same link in the site): a file is rewritten only when its bytes change, and one that left the repository is
   removed, so a second build reads again only what changed. The lessons' copies differ from the committed
   notebooks in two ways that change no output: a collapsed ``checks`` cell gets myst-nb's ``hide-input`` tag
   (its input behind a toggle, as in JupyterLab), and an invisible anchor stands before each cell the interview
   page links to;
3. two generated pages: ``index.md`` (the site's front: the course map's opening, then every page, in order) and
   ``interview.md`` (tools/site_interview.py: every lesson's interview questions, and the seed's where
   ``docs/seed.md`` exists);
4. Sphinx (site/conf.py: myst-nb, no execution, sphinx-book-theme) builds ``<out>`` with warnings as errors;
   nothing is fetched from the network, at build time or when a page is read;
5. checked: a page for each source, each lesson's figures copied; the page count, size and time are printed.

    python tools/build_site.py                          # build/site/ (staging and Sphinx's cache in build/site-work/)
    python tools/build_site.py --out /tmp/site --work /tmp/site-work

Needs the ``site`` extra (Sphinx, myst-nb, sphinx-book-theme: ``pip install -e .[site]``).
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import site_interview  # noqa: E402  (tools/ is not a package)

CONF = ROOT / "site"
#: the network guard: a build run with ``network="refuse"`` fails on any attempt to reach another machine
_REFUSE_NETWORK = """
import socket, sys
def _refused(*args, **kwargs):
    raise OSError("the site's build reached for the network: " + repr(args[:2]))
class _Socket(socket.socket):
    def connect(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refused(address)
        return super().connect(address)
    def connect_ex(self, address):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            _refused(address)
        return super().connect_ex(address)
socket.socket = _Socket
socket.getaddrinfo = _refused
socket.create_connection = _refused
from sphinx.cmd.build import main
sys.exit(main(sys.argv[1:]))
"""


@dataclasses.dataclass(frozen=True)
class Sources:
    """The repository's files a site is built from."""
    lessons: list[Path]
    course_map: Path
    exercises: list[Path]
    guides: list[Path]
    seed: Path | None

    @classmethod
    def of(cls, repository: Path) -> "Sources":
        lessons = sorted((repository / "notebooks").glob("[0-9][0-9]_*.ipynb"))
        exercises = sorted((repository / "exercises").glob("*.ipynb"))
        guides = sorted((repository / "docs").glob("*.md"))
        course_map = repository / "notebooks" / "README.md"
        if not lessons or not exercises or not course_map.exists():
            raise FileNotFoundError(f"{repository}: no lessons (notebooks/NN_*.ipynb), exercises (exercises/*.ipynb) "
                                    "or course map (notebooks/README.md) to build a site from")
        seed = repository / "docs" / "seed.md"
        return cls(lessons, course_map, exercises, guides, seed if seed.exists() else None)


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Write ``data`` unless ``path`` holds it already (then Sphinx does not read it again); True if written."""
    if path.exists() and path.read_bytes() == data:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return True


def _notebook_bytes(notebook: dict) -> bytes:
    return (json.dumps(notebook, indent=1, ensure_ascii=False) + "\n").encode()


def _site_copy_of_lesson(notebook: dict, anchors: dict[int, list[str]]) -> dict:
    """The lesson as the site shows it: collapsed checks cells keep their input behind a toggle; anchors before
    the cells the interview page links to."""
    cells = []
    for cell in notebook["cells"]:
        if cell.get("cell_type") == "code" and cell.get("metadata", {}).get("jupyter", {}).get("source_hidden"):
            tags = list(cell["metadata"].get("tags", []))
            cell = {**cell, "metadata": {**cell["metadata"], "tags": tags + ["hide-input"] * ("hide-input" not in tags)}}
        cells.append(cell)
    return site_interview.with_anchors({**notebook, "cells": cells}, anchors)


def _page_title(path: Path) -> str:
    if path.suffix == ".ipynb":
        return site_interview.title_of(json.loads(path.read_text())["cells"])
    for line in path.read_text().splitlines():
        if line.startswith("# "):
            return line[2:].strip()
    raise ValueError(f"{path}: a page of the site needs a '# Title' heading")


def _docname(path: Path, repository: Path) -> str:
    return path.relative_to(repository).with_suffix("").as_posix()


def _opening(course_map: Path, repository: Path) -> str:
    """The course map's first paragraph (what the course is), its relative links made relative to the site's
    root, where the front page is."""
    paragraphs = course_map.read_text().split("\n\n")
    opening = next(p for p in paragraphs[1:] if p.strip() and not p.lstrip().startswith(("#", "|", "```")))
    folder = course_map.parent.relative_to(repository).as_posix()
    return site_interview.rebased(opening, folder)


def index_page(sources: Sources, repository: Path) -> str:
    """The site's front page: what the course is, then every page in order; the sidebar's order is its toctrees'."""
    def listed(paths: list[Path]) -> list[str]:
        return [f"- [{_page_title(p)}]({p.relative_to(repository).as_posix()})" for p in paths]

    def toctree(caption: str, names: list[str]) -> list[str]:
        return [f"```{{toctree}}", f":caption: {caption}", ":hidden:", "", *names, "```", ""]

    lessons = [_docname(p, repository) for p in sources.lessons]
    lines = ["# zerokit: distributed training, measured", "", _opening(sources.course_map, repository).strip(), "",
             f"Start with the [course map]({sources.course_map.relative_to(repository).as_posix()}) (the path, what "
             "each lesson needs and answers); every question the lessons end with is on the "
             "[interview page](interview.md). This site shows the committed notebooks as they ran; to run them: "
             "`make lab`.", "",
             "## Lessons", "", *listed(sources.lessons), "",
             "## Exercises", "", *listed(sources.exercises), ""]
    if sources.guides:
        lines += ["## Guides", "", *listed(sources.guides), ""]
    lines += toctree("The course", [_docname(sources.course_map, repository), *lessons])
    lines += toctree("Exercises", [_docname(p, repository) for p in sources.exercises])
    if sources.guides:
        lines += toctree("Guides", [_docname(p, repository) for p in sources.guides])
    lines += toctree("Interview", ["interview"])
    return "\n".join(lines)


def stage(repository: Path, src: Path) -> Sources:
    """Write the site's sources into ``src`` (the module's docstring, steps 1-3); returns what they came from."""
    sources = Sources.of(repository)
    lessons = [site_interview.lesson_questions(p, repository) for p in sources.lessons]
    interview_lesson = next((p for p in sources.lessons if p.stem.startswith("12_")), None)
    seed = site_interview.seed_questions(sources.seed, repository, interview_lesson) if sources.seed else []
    wanted: set[Path] = set()

    def put(relative: str, data: bytes) -> None:
        wanted.add(src / relative)
        _write_if_changed(src / relative, data)

    for path, questions in zip(sources.lessons, lessons):
        shown_here = [q for q in seed if q.shown_in == path.relative_to(repository).as_posix()]
        anchors = site_interview.anchors_by_cell(questions + shown_here)
        notebook = _site_copy_of_lesson(json.loads(path.read_text()), anchors)
        put(path.relative_to(repository).as_posix(), _notebook_bytes(notebook))
    for path in [sources.course_map, *sources.exercises]:
        put(path.relative_to(repository).as_posix(), path.read_bytes())
    for path in sorted((repository / "docs").rglob("*")) if (repository / "docs").is_dir() else []:
        if path.is_file():
            put(path.relative_to(repository).as_posix(), path.read_bytes())
    for path in _configuration():
        put(path.relative_to(CONF).as_posix(), path.read_bytes())
    put("index.md", index_page(sources, repository).encode())
    put("interview.md", site_interview.render(lessons, seed).encode())
    for relative, picture in site_interview.figures([q for qs in lessons for q in qs] + seed).items():
        put(relative, picture)
    for path in sorted(src.rglob("*"), reverse=True):  # what left the repository leaves the site
        if path.is_file() and path not in wanted:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
    return sources


def _configuration() -> list[Path]:
    """site/'s files: the configuration, its extension, its static files."""
    return [p for p in sorted(CONF.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def _configuration_digest() -> str:
    digest = hashlib.sha256()
    for path in _configuration():
        digest.update(path.relative_to(CONF).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Built:
    """A built site and what it took."""
    out: Path
    pages: int  # HTML pages, search and index pages included
    bytes: int  # every file of the site
    seconds: float  # staging and Sphinx, wall-clock


def build(out: Path = ROOT / "build" / "site", work: Path = ROOT / "build" / "site-work", *,
          repository: Path = ROOT, network: str = "allow", jobs: str = "1") -> Built:
    """Stage the sources into ``work/src`` and build the site into ``out``. ``network``: ``allow`` (the build
    fetches nothing either way), ``refuse`` (Python's sockets refuse every connection over IP and every name
    look-up: any attempt to reach another machine fails the build) or ``none`` (Sphinx runs in a network
    namespace of its own, with no network at all: ``unshare -n``, as root on Linux) — the tests' proofs that it
    builds offline.
    ``jobs``: Sphinx's ``-j`` (``auto``: a process per core)."""
    if network not in ("allow", "refuse", "none"):
        raise ValueError(f"network={network!r}: allowed are 'allow', 'refuse' and 'none'")
    started = time.perf_counter()
    src = work / "src"
    sources = stage(repository, src)
    # site/ changed since the last build: every page again (Sphinx copies a changed stylesheet only when some page
    # is out of date)
    stamp, digest = work / "configuration.sha256", _configuration_digest()
    fresh = ["-E", "-a"] if not stamp.exists() or stamp.read_text() != digest else []
    args = [*fresh, "-b", "html", "-W", "--keep-going", "-q", "-j", jobs, "-d", str(work / "doctrees"),
            "-D", f"zerokit_repository={repository}", str(src), str(out)]
    command = [sys.executable, "-c", _REFUSE_NETWORK, *args] if network == "refuse" else \
        [sys.executable, "-m", "sphinx", *args]
    if network == "none":
        command = ["unshare", "--net", "--", *command]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"Sphinx failed to build the site (exit code {result.returncode}):\n"
                           f"{result.stderr[-6000:]}{result.stdout[-2000:]}")
    stamp.write_text(digest)
    _check(out, sources, repository)
    files = [p for p in out.rglob("*") if p.is_file()]
    return Built(out, sum(p.suffix == ".html" for p in files), sum(p.stat().st_size for p in files),
                 time.perf_counter() - started)


def _check(out: Path, sources: Sources, repository: Path) -> None:
    """A page for every source; every figure a lesson stores is a picture of its page."""
    pages = [sources.course_map, *sources.lessons, *sources.exercises, *sources.guides]
    missing = [p.relative_to(repository).as_posix() for p in pages
               if not (out / p.relative_to(repository).with_suffix(".html")).exists()]
    missing += [name for name in ("index.html", "interview.html", "search.html") if not (out / name).exists()]
    if missing:
        raise RuntimeError(f"the site has no page for: {', '.join(missing)}")
    for lesson in sources.lessons:
        stored = sum("image/png" in o.get("data", {}) for c in json.loads(lesson.read_text())["cells"]
                     for o in c.get("outputs", []))
        page = (out / lesson.relative_to(repository).with_suffix(".html")).read_text()
        shown = page.count("<img ")
        if shown < stored:
            raise RuntimeError(f"{lesson.name}: {stored} figures stored, {shown} pictures on its page")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="where the site goes")
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "site-work",
                        help="the staged sources and Sphinx's cache (kept: the next build reads only what changed)")
    parser.add_argument("--jobs", default="1", help="Sphinx's -j: processes reading the pages (a number or auto)")
    args = parser.parse_args(argv)
    built = build(args.out, args.work, jobs=args.jobs)
    print(f"site: {built.pages} pages, {built.bytes / 2**20:.1f} MiB in {built.out} "
          f"({built.seconds:.0f} s); open {built.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
