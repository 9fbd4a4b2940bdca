"""Sentences about speed that follow the run: the words are chosen by the measured numbers.

A lesson that says "overlap hides the all-reduce" is right on one machine and wrong on
another (a laptop with 8 cores, a GPU, two ranks sharing two cores). So a lesson never
types a speed verdict: it measures, then asks :func:`speed_sentence` for the sentence,
which names both numbers and says faster, slower or "within the noise" from them, and
adds what the learner should expect elsewhere (``elsewhere``). Lifecycle of a claim:

1. a cell measures two step times (medians of a few steps, and their spread);
2. :func:`speed_sentence` compares them against the noise (the larger relative spread
   of the two, at least :data:`NOISE_FLOOR`) and returns the sentence; :func:`show`
   displays it as Markdown under the cell;
3. every claim made in the kernel is kept in :data:`CLAIMS` with its numbers, so a
   checks cell (and ``tests/course/test_course_claims.py``) can hold the words to them.
:func:`share_words` does the same for a share ("most of", "part of") of a measured whole.
Static prose may speak of speed only as a condition ("where the link is slower than the
compute, …"): ``tests/course/test_course_claims.py`` reads every lesson's Markdown for that.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

#: below this relative difference two step times are "within the noise" whatever their spread (shared cores)
NOISE_FLOOR = 0.10


@dataclass
class Claim:
    """One measured comparison and the verdict its sentence gave."""

    a: str
    a_s: float
    b: str
    b_s: float
    noise: float
    verdict: str  # "faster", "slower" or "tie": a against b

    def holds(self) -> bool:
        """The verdict agrees with the numbers it was made from."""
        ratio = self.a_s / self.b_s
        if self.verdict == "tie":
            return abs(ratio - 1) <= self.noise
        return (ratio < 1 - self.noise) if self.verdict == "faster" else (ratio > 1 + self.noise)


#: the claims this kernel made, in order
CLAIMS: List[Claim] = []


def verdict(a_s: float, b_s: float, noise: float = NOISE_FLOOR) -> str:
    """``"faster"`` when a took less than b by more than the noise, ``"slower"`` when more, else ``"tie"``."""
    if not (a_s > 0 and b_s > 0):
        raise ValueError(f"step times must be positive, got {a_s!r} and {b_s!r}")
    ratio = a_s / b_s
    return "faster" if ratio < 1 - noise else "slower" if ratio > 1 + noise else "tie"


def speed_sentence(a: str, a_s: float, b: str, b_s: float, spread: float = 0.0, elsewhere: str = "",
                   unit: str = "ms") -> str:
    """The sentence comparing two measured step times (seconds), chosen by them. ``spread``: the runs' relative
    spread (IQR / median, the larger of the two); ``elsewhere``: what another machine shows, stated as a condition."""
    noise = max(NOISE_FLOOR, float(spread))
    v = verdict(a_s, b_s, noise)
    scale = 1000.0 if unit == "ms" else 1.0
    numbers = f"{a} {a_s * scale:.1f} {unit}, {b} {b_s * scale:.1f} {unit}"
    if v == "tie":
        text = f"On this machine {numbers}: within the noise of each other (±{noise:.0%})."
    else:
        ratio = b_s / a_s if v == "faster" else a_s / b_s
        text = f"On this machine {numbers}: {a} was {v}, by {ratio:.2f}×."
    CLAIMS.append(Claim(a, a_s, b, b_s, noise, v))
    return f"{text} {elsewhere}".strip()


def share_words(fraction: float) -> str:
    """The words for a measured share of a whole, chosen by it: ``"most of"`` (≥ 60 %), ``"about half of"``
    (40–60 %), ``"part of"`` (10–40 %), ``"almost none of"`` (below 10 %)."""
    if not 0 <= fraction <= 1:
        raise ValueError(f"a share is between 0 and 1, got {fraction!r}")
    return ("most of" if fraction >= 0.6 else "about half of" if fraction >= 0.4 else "part of" if fraction >= 0.1
            else "almost none of")


def show(text: str) -> Optional[object]:
    """Display ``text`` as Markdown under the cell (printed where IPython is absent); returns None."""
    try:
        from IPython.display import Markdown, display
    except ImportError:  # pragma: no cover - the course runs in Jupyter
        print(text)
        return None
    display(Markdown(text))
    return None
