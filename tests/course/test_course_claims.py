"""Speed sentences follow the run: measured verdicts are chosen by the numbers, static prose states conditions.

A lesson's Markdown is the same on every machine; its step times are not. So a Markdown
sentence that compares speeds ("faster", "slower", "hides", "wins") must state the
condition it holds under ("where the link is slower than …", "on a GPU", "when …") or
point at the measured sentence below it; the verdicts themselves come from
:func:`zerokit.course.speed_sentence`, whose words are chosen by the numbers (tested here).
"""
import json
import re
from pathlib import Path

import pytest

from zerokit.course import claims

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted((ROOT / "notebooks" / "src").glob("*.py"))
#: words that compare speeds
SPEED = re.compile(r"\b(faster|slower|speeds? up|slows? down|quicker|hides? (?:the|its|their) (?:communication|"
                   r"all-reduce|gathers?|transfers?|copies)|hidden behind|outruns?|wins?|costs? more time|"
                   r"costs? less time)\b", re.I)
#: what makes a sentence a condition, a quotation, or a pointer to the measured verdict rather than a verdict
CONDITIONAL = re.compile(r"\b(where|when|whenever|if|unless|on a GPU|with more cores|would|could|may|might|"
                         r"seed|claims?|says|asks?|question|predict|interviewers?)\b", re.I)


def markdown_sentences(path: Path):
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("notebook_build", ROOT / "notebooks" / "build.py")
    build = module_from_spec(spec)
    spec.loader.exec_module(build)
    for kind, body in build.parse_cells(path.read_text()):
        if kind != "markdown":
            continue
        text = re.sub(r"<details>.*?</details>", " ", body, flags=re.S)  # interview answers: reasoning, not runs
        text = re.sub(r"`[^`]*`", " ", text)
        for sentence in re.split(r"(?<=[.!?])\s+|\n\s*[-*] ", text):
            yield " ".join(sentence.split())


def unconditioned(path: Path) -> list:
    return [s for s in markdown_sentences(path) if SPEED.search(s) and not CONDITIONAL.search(s)]


@pytest.mark.parametrize("lesson", [p.stem for p in SOURCES])
def test_no_lesson_types_a_speed_verdict(lesson):
    found = unconditioned(ROOT / "notebooks" / "src" / f"{lesson}.py")
    assert not found, "state the condition, or let course.speed_sentence say it from the numbers:\n" + "\n".join(found)


@pytest.mark.parametrize("a,b,spread,expected", [(0.100, 0.150, 0.0, "faster"), (0.150, 0.100, 0.0, "slower"),
                                                  (0.100, 0.105, 0.0, "tie"), (0.100, 0.130, 0.4, "tie")])
def test_the_sentence_is_chosen_by_the_numbers(a, b, spread, expected):
    before = len(claims.CLAIMS)
    text = claims.speed_sentence("overlap", a, "no overlap", b, spread=spread, elsewhere="On a GPU …")
    claim = claims.CLAIMS[before]
    assert claim.verdict == expected and claim.holds()
    assert f"{a * 1000:.1f} ms" in text and f"{b * 1000:.1f} ms" in text and text.endswith("On a GPU …")
    assert ("within the noise" in text) == (expected == "tie")


def test_every_claim_a_committed_lesson_made_agrees_with_its_numbers():
    """The committed outputs carry the sentences the run chose: each names two times and a verdict that fits them."""
    pattern = re.compile(r"On this machine (.+?) ([\d.]+) ms, (.+?) ([\d.]+) ms: (?:within the noise of each other "
                         r"\(±(\d+)%\)|\1 was (faster|slower), by)")
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            for output in cell.get("outputs", []):
                text = "".join(output.get("data", {}).get("text/markdown", "")) + "".join(output.get("text", ""))
                for m in pattern.finditer(text):
                    a, b = float(m.group(2)), float(m.group(4))
                    if m.group(5):  # a tie: within the stated noise
                        assert abs(a / b - 1) <= int(m.group(5)) / 100 + 0.005, (path.name, m.group(0))
                    else:
                        assert (a < b) == (m.group(6) == "faster"), (path.name, m.group(0))


#: a quantity a sentence quotes: milliseconds, or bytes written with thousands separators ("30,690 B")
QUOTED = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?) ?(ms|B)\b")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")


def _decimals(number: str) -> int:
    return len(number.split(".", 1)[1]) if "." in number else 0


def _quotes(number: str, printed: list) -> bool:
    """Some printed number is ``number`` at the coarser of the two precisions (34.82 printed, 34.8 quoted)."""
    value = float(number.replace(",", ""))
    return any(abs(float(p.replace(",", "")) - value) <= 0.5 * 10 ** -min(_decimals(number), _decimals(p)) + 1e-9
               for p in printed)


def misquoted(cell: dict) -> list:
    """Numbers a cell's sentences (its Markdown outputs) quote in a unit its printed outputs (streams, tables) also
    show, that no printed number matches: a sentence and a table beside it giving two figures for one quantity."""
    sentences, printed = [], []
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if "text/markdown" in data:
            sentences.append("".join(data["text/markdown"]))
        elif "text" in output:
            printed.append("".join(output["text"]))
        elif "text/plain" in data and "image/png" not in data:
            printed.append("".join(data["text/plain"]))
    if not sentences or not printed:
        return []
    shown = "\n".join(printed)
    numbers = NUMBER.findall(shown)
    units = {u for u in ("ms", "B") if re.search(rf"(?<![\w]){u}\b", shown)}
    return [f"{cell.get('id')}: {n} {u} in {s[:100]!r}…" for s in sentences for n, u in QUOTED.findall(s)
            if u in units and (u != "B" or "," in n) and not _quotes(n, numbers)]


def test_a_sentence_quotes_the_numbers_its_cell_printed():
    """One figure per quantity per run: a sentence under a table names the table's number, not another median."""
    found = [f"{path.name} {m}" for path in sorted((ROOT / "notebooks").glob("*.ipynb"))
             for cell in json.loads(path.read_text())["cells"] for m in misquoted(cell)]
    assert not found, "a sentence quotes a figure its cell printed differently:\n" + "\n".join(found)


def test_the_quote_check_catches_two_figures_for_one_step():
    def cell(printed, sentence):
        return {"id": "c1", "outputs": [{"output_type": "stream", "name": "stdout", "text": printed},
                                        {"output_type": "display_data", "data": {"text/markdown": sentence}}]}

    assert misquoted(cell("ddp step 29.8 ms, bucketed 30.2 ms\n", "On this machine ddp 30.9 ms, bucketed 31.7 ms."))
    assert not misquoted(cell("ddp step 34.82 ms\n", "On this machine ddp 34.8 ms, within the noise."))
    assert not misquoted(cell("step 46 ms\n", "ZB-H1 46.0 ms."))
    assert not misquoted(cell("share 0.2\n", "estimated for 7 B below, 12.0 ms"))  # no ms printed: not comparable
    assert misquoted(cell("EP 30,690 B per layer\n", "EP measured 32,761.3 B per layer"))


@pytest.mark.parametrize("fraction,words", [(0.9, "most of"), (0.5, "about half of"), (0.22, "part of"),
                                            (0.02, "almost none of")])
def test_a_share_is_worded_by_its_size(fraction, words):
    assert claims.share_words(fraction) == words
