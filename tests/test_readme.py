"""README is a front page: short, every link alive, every guide page reachable from it."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250


def _links(path: Path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if not re.match(r"^(https?:|mailto:|#)", target):
            yield target.split("#", 1)[0]


def test_readme_is_a_front_page():
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md is {len(lines)} lines; move detail to a page in docs/"
    text = README.read_text()
    for must in ("make tour", "make test", "make lab", "## The course", "def loop(ctx):", "## Where to read more"):
        assert must in text, must


def test_every_link_of_readme_and_the_guide_pages_resolves():
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        for target in _links(page):
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links {target}, which is not there"


def test_every_guide_page_is_linked_from_readme():
    linked = {(ROOT / t).resolve() for t in _links(README)}
    for page in sorted((ROOT / "docs").glob("*.md")):
        assert page.resolve() in linked, f"docs/{page.name} is not linked from README.md"


def test_the_link_table_of_the_planner_page_is_the_presets():
    from zerokit.runtime import link

    text = (ROOT / "docs" / "planner.md").read_text()
    for name in link.PRESETS:
        one = link.resolve(name)
        if one is None or hasattr(one, "intra"):
            continue
        row = next(l for l in text.splitlines() if l.startswith(f"| `{name}` |"))
        assert f"{one.alpha_s * 1e6:g} µs" in row, row
