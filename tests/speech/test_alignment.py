"""Re-alignment of the hypothesis to the committed transcript (pure function)."""

from mmspec.speech.hybrid import align_hypothesis

H = [10, 11, 12, 13, 14, 15, 16, 17]


def test_exact_prefix():
    assert align_hypothesis([], H, 0) == 0
    assert align_hypothesis([10, 11, 12], H, 3) == 3
    assert align_hypothesis(H, H, 8) == 8


def test_insertion_in_hypothesis_skips_ahead():
    # hypothesis had an extra token 12; the target went 10 11 13
    assert align_hypothesis([10, 11, 13], H, 3) == 4


def test_deletion_in_hypothesis_steps_back():
    # after a substitution guess the target produced 12 again: resume after 12
    assert align_hypothesis([10, 11, 99, 12], H, 4) == 3


def test_substitution_has_no_suffix_match():
    assert align_hypothesis([10, 11, 99], H, 3) is None


def test_longest_suffix_wins_over_closest():
    hyp = [1, 2, 3, 7, 1, 2, 3, 8, 4]
    # suffix "2 3" occurs ending at 3 and 7; "9 2 3" nowhere; anchor 6 -> the closer one (7)
    assert align_hypothesis([9, 2, 3], hyp, 6) == 7
    # a longer suffix match beats a closer shorter one
    hyp2 = [5, 6, 7, 0, 0, 7, 0, 0]
    assert align_hypothesis([5, 6, 7], hyp2, 6) == 3


def test_window_and_floor():
    hyp = [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
    # one-token suffixes may move at most 2 positions
    assert align_hypothesis([1, 1, 1, 27], hyp, 4) is None
    assert align_hypothesis([1, 1, 1, 25], hyp, 4) == 6
    # longer suffixes may travel the window (8) but no further
    assert align_hypothesis([1, 26, 27, 28], hyp, 4) == 9
    assert align_hypothesis([1, 26, 27, 28], hyp, 4, window=3) is None
    # never behind the floor (already consumed hypothesis)
    assert align_hypothesis([1, 1, 1, 21], hyp, 3) == 2
    assert align_hypothesis([1, 1, 1, 21], hyp, 3, floor=3) is None


def test_min_suffix_and_ties_go_forward():
    hyp = [7, 1, 7]
    assert align_hypothesis([0, 7], hyp, 2) == 3  # ends at 1 and 3 are both 1 away from 2: forward wins
    assert align_hypothesis([0, 7], hyp, 2, min_suffix=2) is None


def test_empty_inputs():
    assert align_hypothesis([1, 2], [], 2) is None
    assert align_hypothesis([], [], 0) == 0
