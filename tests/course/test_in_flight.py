"""zerokit.course.in_flight: the sum, the union and the most at once of some collectives' spans, on spans whose
answers are known by hand, and bad spans refused."""
import pytest

from zerokit.course.in_flight import overlap_of


def test_queued_spans_sum_to_more_than_their_union():
    """Three buckets launched at 0, 1 and 2 ms and carried one after another, done at 4, 6 and 8 ms: each waits
    behind the one before, so 4 + 5 + 6 = 15 ms are summed inside 8 ms, all three in flight from 2 to 4 ms."""
    got = overlap_of([(0.000, 0.004), (0.001, 0.006), (0.002, 0.008)])
    assert got["summed_s"] == pytest.approx(0.015, abs=1e-12)
    assert got["union_s"] == pytest.approx(0.008, abs=1e-12)
    assert got["most_at_once"] == 3


def test_spans_one_after_another_do_not_overlap():
    got = overlap_of([(3.0, 4.0), (0.0, 1.0), (1.0, 2.5)])  # out of order; one ends where the next starts
    assert got == {"summed_s": 3.5, "union_s": 3.5, "most_at_once": 1}


def test_no_spans_and_a_backward_span():
    assert overlap_of([]) == {"summed_s": 0.0, "union_s": 0.0, "most_at_once": 0}
    with pytest.raises(ValueError, match="spans must end after they start"):
        overlap_of([(1.0, 0.5)])
