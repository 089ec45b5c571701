"""Answer keys: equivalent numbers give one key, prose around an answer does not change it, and
the extractors find what they promise."""

from __future__ import annotations


import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrt_fast import MrtInputError
from mrt_fast.answers import keys
from mrt_fast.answers.extract import answer_line, extractor, find_boxed, find_choice, last_number
from mrt_fast.answers.keys import canonical, format_number, parse_number

from answer_forms import forms, rationals  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(rationals)
def test_every_way_of_writing_a_rational_gives_one_key(v):
    want = format_number(v)
    got = {f: canonical(f, symbolic=False) for f in forms(v)}
    assert set(got.values()) == {want}, got
    assert parse_number(want) == v  # the key reads back as the same number


@settings(max_examples=200, deadline=None)
@given(rationals, st.sampled_from(["The answer is {}.", "So we get {} in total", "{}",
                                   "First 3 + 4 = 7. Then the result is {}!", "Answer: {}"]))
def test_the_last_number_is_found_whatever_the_prose(v, template):
    text = template.format(forms(v)[0])
    assert canonical(last_number(text), symbolic=False) == format_number(v)


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40),
       st.text(alphabet="abcdefghij ,;:!?\n", max_size=40), rationals)
def test_a_boxed_answer_is_found_whatever_surrounds_it(before, after, v):
    text = f"{before} \\boxed{{{forms(v)[1]}}} {after}"
    assert canonical(find_boxed(text), symbolic=False) == format_number(v)


def test_numbers_in_common_forms():
    same = ["0.5", "1/2", ".50", "\\frac{1}{2}", "\\frac12", "\\dfrac{1}{2}", "$0.5$", "50%"[:0] + "0.50"]
    assert {canonical(s, symbolic=False) for s in same} == {"1/2"}
    assert canonical("1,234", symbolic=False) == canonical("1234.0", symbolic=False) == "1234"
    assert canonical("-0", symbolic=False) == "0"
    assert canonical("x = 5", symbolic=False) == "5"
    assert canonical("10^\\circ", symbolic=False) == "10"
    assert canonical("\\text{ 12 }", symbolic=False) == "12"
    assert canonical("  ", symbolic=False) is None and canonical(None) is None
    assert canonical("x + 1", symbolic=False) == canonical("x+1", symbolic=False)


def test_last_number_keeps_signs_and_separators():
    assert last_number("it went from 3 to -7") == "-7"
    assert last_number("x-7") == "7"  # a minus after a letter is not a sign
    assert last_number("5 - 3") == "3" and last_number("is -3") == "-3" and last_number("(-3)") == "-3"
    assert last_number("The product is 408.") == "408"
    assert last_number("costs 1,234.50 dollars") == "1,234.50"
    assert last_number("1, 2, 3") == "3"
    assert last_number("half is \\frac{1}{2}") == "1/2"
    assert last_number("ratio 3/4") == "3/4"
    assert last_number("no digits here") is None


def test_boxed_with_nested_braces():
    assert find_boxed("so \\boxed{\\frac{1}{2}} and then \\boxed{x^{2}+1}") == "x^{2}+1"
    assert find_boxed("\\boxed 5") == "5"
    assert find_boxed("\\boxed{unclosed") is None
    assert find_boxed("nothing") is None


def test_answer_lines():
    assert answer_line("work\nFinal answer: 408 apples\n") == "408"
    assert answer_line("Answer: \\boxed{7}") == "7"
    assert answer_line("blah\n#### 72") == "72"
    assert answer_line("The answer is: New York.") == "New York"
    assert answer_line("no such line") is None


def test_choices():
    assert find_choice("I think the answer is (C).") == "C"
    assert find_choice("Answer: b") == "B"
    assert find_choice("\\boxed{D}") == "D"
    assert find_choice("Between (A) and (B), (B) fits") == "B"
    assert find_choice("B\n") == "B"
    assert find_choice("the answer is F", "ABCD") is None
    assert find_choice("a cat") is None  # a lower-case word is no choice


def test_json_and_regex_extractors():
    ex = extractor("json:result.items.1")
    assert ex.key(ex.raw('text ```json\n{"result": {"items": ["a", " b  c "]}}\n``` more')) == "b c"
    assert ex.raw("no json") is None and ex.raw('{"result": 3}') is None
    num = extractor("json:n")
    assert num.key(num.raw('{"n": 0.5}')) == num.key(num.raw('{"n": 0.50}')) == "1/2"
    rx = extractor(r"regex:Result=(\d+)")
    assert rx.key(rx.raw("Result=3 then Result=12")) == "12"
    named = extractor(r"regex:(x)=(?P<answer>\d+)")
    assert named.key(named.raw("x=4")) == "4"


@pytest.mark.parametrize("spec, says", [
    (r"regex:\d+", "has no group"), ("regex:(", "does not compile"), ("json:", "field path"),
    ("json:a..b", "field path"), ("choice:A1", "distinct letters"), ("nonsense", "unknown extract"),
    (3, "extract must be one of"), ("regex:", "needs a pattern"),
])
def test_bad_extract_specs_are_one_line(spec, says):
    with pytest.raises(MrtInputError, match=says) as e:
        extractor(spec)
    assert "\n" not in str(e.value)


def test_bad_normalize_is_one_line():
    with pytest.raises(MrtInputError, match="normalize must be"):
        extractor("boxed", normalize="lower")


def test_symbolic_equivalence_with_the_extra():
    pytest.importorskip("math_verify")
    assert keys.has_math_verify()
    assert canonical("\\sqrt{8}") == canonical("2\\sqrt{2}")
    assert canonical("\\frac{\\pi}{2}") == canonical("\\pi/2")
    assert canonical("\\frac{6}{4}") == "3/2"
    # prose is never parsed as a product of symbols
    assert canonical("hello world") == "helloworld"


def test_the_light_path_serves_without_the_extra(monkeypatch):
    monkeypatch.setattr(keys, "has_math_verify", lambda: False)
    assert canonical("0.5") == canonical("\\frac{1}{2}") == "1/2"
    assert canonical("\\sqrt{8}") == "\\sqrt{8}"  # no symbolic parser: its text


@given(st.text(alphabet="xyzqw ,.;:!?\n0123456789", max_size=60), st.text(alphabet="xyzqw ,.;!?\n", max_size=60),
       st.sampled_from("ABCDE"), st.sampled_from(["The answer is ({}).", "Answer: {}", "\\boxed{{{}}}"]))
def test_a_choice_is_found_whatever_prose_surrounds_it(before, after, letter, template):
    assert find_choice(f"{before}\n{template.format(letter)}\n{after}") == letter


@given(st.text(alphabet="abcxyz ,.;!?$\n0123456789", max_size=60), rationals)
def test_an_answer_line_is_found_after_any_working(before, v):
    text = f"{before}\nFinal answer: {forms(v)[0]}\n"
    assert canonical(answer_line(text), symbolic=False) == format_number(v)
