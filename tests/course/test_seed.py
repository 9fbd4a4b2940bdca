"""The seed, the interview article the course answers, is introduced once (docs/seed.md: what it is, its
questions, its claims in English beside the original) and linked from where a learner meets it; every quote of
it in the lessons this covers, the course map, the README and the package is given beside an English rendering,
never bare; lesson 12 opens with its one-page answer and the numbers to know."""
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
SEED = ROOT / "docs" / "seed.md"
CJK = re.compile(r"[\u4e00-\u9fff]")
#: the lessons whose quotes of the seed this file holds (their sources), the course map and the README
QUOTING = [ROOT / "notebooks" / "src" / f"{name}.py" for name in ("03_data_parallel", "06_zero3", "12_the_interview")]
QUOTING += [ROOT / "notebooks" / "README.md", ROOT / "README.md"]


def _paragraphs(path: Path) -> list:
    """Blocks of text separated by blank lines (a lesson source's ``# `` comment markers taken off)."""
    lines = [line[2:] if line.startswith("# ") else line.lstrip("#") if line.startswith("#") else line
             for line in path.read_text().splitlines()]
    return [" ".join(block.split()) for block in "\n".join(lines).split("\n\n")]


def _table_rows(text: str, heading: str) -> list:
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in section.splitlines() if line.startswith("| ") and not line.startswith("| the ")]


def test_the_seed_is_introduced_once_with_its_questions_and_claims_in_english_beside_the_original():
    text = SEED.read_text()
    assert "**What it is.**" in text and "interview" in text
    for heading, columns, at_least in (("## Its questions", 3, 6), ("## Its claims", 4, 10)):
        rows = _table_rows(text, heading)
        assert len(rows) >= at_least, heading
        for row in rows:
            assert len(row) == columns, row
            english, original = row[0], row[1]
            assert not CJK.search(english) and len(english.split()) >= 5, row  # an English sentence…
            assert CJK.search(original) or "`" in original, row  # …beside the original (or its code)
            assert "../notebooks/" in row[-1], row  # and where the course answers it


@pytest.mark.parametrize("where", [ROOT / "README.md", ROOT / "notebooks" / "README.md",
                                   ROOT / "notebooks" / "src" / "03_data_parallel.py",
                                   ROOT / "notebooks" / "src" / "06_zero3.py",
                                   ROOT / "notebooks" / "src" / "12_the_interview.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_where_a_learner_meets_the_seed_it_links_the_introduction(where):
    assert "docs/seed.md" in where.read_text()


@pytest.mark.parametrize("path", QUOTING + sorted((ROOT / "zerokit").rglob("*.py")),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_quote_of_the_seed_stands_beside_an_english_rendering(path):
    """The original sits in parentheses, after the English (or, in a code comment, not at all)."""
    for paragraph in _paragraphs(path):
        if not CJK.search(paragraph):
            continue
        bare = re.sub(r"“[^”]*”", "", paragraph)  # the originals in their own quotation marks taken out…
        bare = re.sub(r"\((?:[^()]|（[^（）]*）)*\)", "", bare)  # …and those in parentheses
        assert not CJK.search(bare), f"{path.name}: a quote without its English beside it: {paragraph[:200]!r}"
        assert re.search(r"[A-Za-z]{3,}(?:\W+[A-Za-z]{2,}){3,}", bare), f"{path.name}: {paragraph[:200]!r}"


def test_the_interview_opens_with_the_one_page_answer_and_the_numbers_to_know():
    cells = nbformat.read(ROOT / "notebooks" / "12_the_interview.ipynb", as_version=4).cells
    headings = [(i, c.source.splitlines()[0]) for i, c in enumerate(cells) if c.cell_type == "markdown"]
    assert headings[1] == (1, "## The one-page answer")
    numbers = next(i for i, h in headings if h == "## The numbers to know")
    assert numbers <= 4
    shown = "".join(o.get("text", "") for o in cells[numbers + 1].outputs)
    for stage, gb in (("DDP", "120 GB"), ("ZeRO-1", "31.4 GB"), ("ZeRO-2", "16.6 GB"), ("ZeRO-3", "1.88 GB")):
        assert re.search(rf"{stage} .*= +{gb}", shown), (stage, shown)  # the ZeRO paper's Table 1, computed
    checks = cells[numbers + 2]
    assert "checks" in checks.metadata.get("tags", []) and "paper_table_1" in checks.source
