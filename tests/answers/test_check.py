"""Checkers: a reference written in any form checks the same answer; numeric tolerance is the
promised inequality; rewards lie between the wrong and correct levels."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError
from mrt_fast.answers.check import Rewards, checker, reference_key
from mrt_fast.answers.extract import extractor

from answer_forms import forms, rationals

EX = extractor("last_number")


@settings(max_examples=150, deadline=None)
@given(rationals, st.data())
def test_exact_check_accepts_every_form_of_the_reference(v, data):
    ref_form = data.draw(st.sampled_from(forms(v)))
    answer = data.draw(st.sampled_from(forms(v)))
    ck = checker("exact")
    key = EX.key(EX.raw(f"So the answer is {answer}"))
    assert ck.score(key, ck.reference_keys(ref_form, EX)) == 1.0
    other = EX.key(EX.raw(f"So the answer is {forms(v + 1)[0]}"))
    assert ck.score(other, ck.reference_keys(ref_form, EX)) == 0.0


@settings(max_examples=200, deadline=None)
@given(rationals, rationals, st.floats(0, 10), st.floats(0, 0.5))
def test_numeric_check_is_the_tolerance_inequality(a, b, abs_tol, rel_tol):
    ck = checker("numeric", abs_tol=abs_tol, rel_tol=rel_tol)
    got = ck.score(EX.key(str(float(a))), reference_key(str(float(b)), EX))
    fa, fb = float(Fraction(str(float(a)))), float(Fraction(str(float(b))))
    assert got == (1.0 if abs(fa - fb) <= max(abs_tol, rel_tol * abs(fb)) else 0.0)


@given(st.floats(-5, 5), st.floats(-5, 5), st.floats(-5, 5), st.floats(0, 1), st.booleans())
def test_rewards_lie_between_wrong_and_correct(correct, wrong, missing, score, partial):
    rw = Rewards(correct, wrong, missing, partial)
    r = rw.of(score)
    assert min(correct, wrong) - 1e-12 <= r <= max(correct, wrong) + 1e-12
    assert rw.of(None) == missing and rw.of(1.0) == correct and rw.of(0.0) == wrong
    if not partial and score < 1.0:
        assert r == wrong


def test_set_check_and_bad_tolerances():
    ck = checker("set")
    assert ck.score("3", ck.reference_keys(["3.0", "4"], EX)) == 1.0
    assert ck.score("5", ck.reference_keys('["3", "4"]', EX)) == 0.0
    assert ck.reference_keys(None, EX) is None
    with pytest.raises(MrtInputError, match="abs_tol must be a finite number >= 0"):
        checker("numeric", abs_tol=-1)
