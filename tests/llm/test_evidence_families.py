"""The task families of the pre-registered LLM evidence (bench/experiments/llm_evidence/families.py): every checker grades
its family's valid answers valid, its near misses near-miss and its wrong answers wrong; pools draw from the
valid answers; prompt roles never overlap where they must not."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "experiments"))

from llm_evidence import families as fam  # noqa: E402

NAMES = sorted(fam.FAMILIES)
items = st.sampled_from(NAMES).flatmap(
    lambda n: st.integers(0, len(fam.prompt_pool(n)) - 1).map(lambda i: fam.prompt_pool(n)[i]))


def test_there_are_ten_study_families_and_a_control():
    assert len(fam.STUDY) >= 10
    assert [n for n, f in fam.FAMILIES.items() if f.control] == ["product"]
    assert all(len(it.valid) == 1 for it in fam.prompt_pool("product")[:50])


@settings(max_examples=300, deadline=None)
@given(items)
def test_every_valid_answer_passes_and_every_near_miss_fails(it):
    assert it.valid and it.near_miss and it.wrong
    for r in it.valid:
        assert it.grade(r) == fam.VALID and it.check(r)
        assert it.grade(f" {r}.") == fam.VALID  # spaces and a final period are not part of the answer
    for r in it.near_miss:
        assert it.grade(r) == fam.NEAR_MISS and not it.check(r)
    for r in it.wrong:
        assert it.grade(r) == fam.WRONG
    assert not set(it.valid) & set(it.near_miss)


@settings(max_examples=200, deadline=None)
@given(items, st.text(max_size=12))
def test_any_text_gets_a_grade(it, text):
    assert it.grade(text) in fam.REWARD


@settings(max_examples=100, deadline=None)
@given(items, st.integers(1, 16), st.integers(0, 3))
def test_pools_are_balanced_draws_of_valid_answers(it, size, seed):
    pool = it.pool(size, seed)
    assert len(pool) == size and set(pool) <= set(it.valid)
    counts = Counter(pool)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert len(counts) == min(size, len(it.valid))
    assert it.pool(size, seed) == pool  # deterministic


def test_families_are_deterministic_and_prompts_distinct():
    for n in NAMES:
        pool = fam.prompt_pool(n)
        assert len({it.prompt for it in pool}) == len(pool)
        fam.prompt_pool.cache_clear()
        assert [it.prompt for it in fam.prompt_pool(n)] == [it.prompt for it in pool]


def test_prompt_roles():
    for n in NAMES:
        held = {it.prompt for it in fam.heldout_prompts(n)}
        assert len(held) == fam.N_HELDOUT
        pilot = {it.prompt for it in fam.pilot_prompts(n, 96)}
        warm = {it.prompt for it in fam.warm_prompts(n, 32, 96)}
        assert not held & pilot and not held & warm and not pilot & warm
        seeds = [{it.prompt for it in fam.training_prompts(n, s, 48)} for s in range(4)]
        assert all(len(s) == 48 and not s & held for s in seeds)
        assert len({frozenset(s) for s in seeds}) == 4  # each seed draws its own training prompts
        assert {it.prompt for it in fam.training_prompts(n, 2, 48)} == seeds[2]


def test_roles_refuse_more_prompts_than_the_pool_holds():
    import pytest

    n = "letter"
    with pytest.raises(ValueError, match="training pool"):
        fam.training_prompts(n, 0, len(fam.train_pool(n)) + 1)
    with pytest.raises(ValueError, match="warm-up"):
        fam.warm_prompts(n, 100, 100)


def test_the_mixture_mixes_one_answer_and_many_answer_prompts():
    sizes = Counter(len(it.valid) for it in fam.pilot_prompts("mixture", 96))
    assert set(sizes) == {1, 40} and min(sizes.values()) >= 30
