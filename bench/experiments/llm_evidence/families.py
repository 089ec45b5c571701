"""Task families for the pre-registered test of the variance law, generated in code (nothing is read).

Every family turns an integer index into one prompt with a known answer set
and a checker that grades any response ``valid``, ``near_miss`` or ``wrong``
(reward 1, 0.5, 0). The families differ in how many answers are valid and in
how different their prompts are, so that their pilot ratios V_y|x / V_x spread
out:

* ``pick2``, ``pick4``, ``pick8``: "Name one of these numbers: ..." with m
  listed numbers (m valid answers).
* ``range3``, ``range10``, ``range40``: "Name a whole number strictly between
  lo and hi", with 3, 10 or 40 numbers in between.
* ``neighbour``: a number that differs from n by exactly 1 (two answers).
* ``divisor``: a divisor of n other than 1 and n (4 or more answers).
* ``multiple``: a multiple of d between lo and hi (6 to 12 answers).
* ``sum``: two positive whole numbers, neither above m, that add up to n,
  as ``a + b`` (2m - n + 1 answers, 2 to 39).
* ``letter``: a letter of a given word (its distinct letters).
* ``mixture``: half ``product`` prompts (one answer), half ``range40``
  prompts (40 answers), mixed to raise V_x.
* ``product`` (the control, V_y|x = 0): "What is a * b?", one answer.

The answer pools the pilot scores are draws from the uniform distribution on
a prompt's valid answers (balanced: with m < pool size every answer appears
equally often, up to one), so V_y|x is the spread of the loss over the answers
a multi-response target holds.

Prompt roles: a family's prompts are its indices 0, 1, 2, ... up to its pool
size (distinct prompt texts). A fixed set of held-out prompts is never used
for training or pilots; the rest is the training pool. `pilot_prompts` and
`warm_prompts` are fixed, disjoint slices of the training pool (the warm-up of
a warm pilot never sees a scored prompt), and `training_prompts(family, seed,
n)` draws each seed's own training prompts from the whole training pool.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable

VALID, NEAR_MISS, WRONG = "valid", "near_miss", "wrong"
REWARD = {VALID: 1.0, NEAR_MISS: 0.5, WRONG: 0.0}
#: prompts of a family's held-out set (never trained on, never piloted)
N_HELDOUT = 64
#: the most prompts a family's pool holds (small families hold fewer)
POOL_MAX = 1200


@dataclass(frozen=True)
class Item:
    """One prompt: its id, text, the full valid answer set (canonical spellings), and examples of near misses
    and wrong answers (each graded so by the family's checker)."""

    family: str
    index: int
    prompt: str
    valid: tuple[str, ...]
    near_miss: tuple[str, ...]
    wrong: tuple[str, ...]
    params: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def prompt_id(self) -> str:
        return f"{self.family}-{self.index}"

    def grade(self, response: str) -> str:
        return FAMILIES[self.family].grade(self.params, response)

    def check(self, response: str) -> bool:
        return self.grade(response) == VALID

    def pool(self, size: int, seed: int = 0) -> list[str]:
        """``size`` balanced draws from the valid answers (each answer ceil or floor size/m times), shuffled."""
        rng = random.Random(f"pool:{self.prompt_id}:{seed}")
        v = list(self.valid)
        rng.shuffle(v)
        out = (v * (size // len(v) + 1))[:size]
        rng.shuffle(out)
        return out


@dataclass(frozen=True)
class Family:
    name: str
    description: str
    make: Callable[[random.Random], dict] = field(repr=False)  # params of one prompt from a seeded rng
    text: Callable[[dict], str] = field(repr=False)  # the prompt text
    answers: Callable[[dict], tuple[list[str], list[str], list[str]]] = field(repr=False)  # valid, near, wrong
    grade: Callable[[dict, str], str] = field(repr=False)
    control: bool = False


# ------------------------------------------------------------------ parsing


def number(s: str) -> int | None:
    """The whole number a response states: optional spaces and a final period around an integer."""
    m = re.fullmatch(r"\s*(-?\d+)\s*\.?\s*", s)
    return int(m.group(1)) if m else None


def _grade_number(x: int | None, valid: set[int], near: set[int]) -> str:
    if x is None:
        return WRONG
    if x in valid:
        return VALID
    return NEAR_MISS if x in near else WRONG


def _far(valid: set[int], near: set[int], around: int) -> list[str]:
    """Wrong examples: numbers far from every valid and near-miss answer, plus a non-number."""
    out = [str(around + d) for d in (137, 311, -97) if around + d not in valid | near]
    return out + ["none", "I don't know"]


def _sorted(xs) -> list[str]:
    return [str(x) for x in sorted(xs)]


# ------------------------------------------------------------------ number families


def _product_make(rng):
    return {"a": rng.randint(11, 99), "b": rng.randint(2, 9)}


def _product_sets(p):
    v = p["a"] * p["b"]
    return {v}, {v + d for d in (-10, -2, -1, 1, 2, 10)}


def _pick_make(m):
    def make(rng):
        nums = []
        while len(nums) < m:
            x = rng.randint(10, 99)
            if all(abs(x - y) >= 3 for y in nums):
                nums.append(x)
        return {"nums": nums}

    return make


def _pick_sets(p):
    v = set(p["nums"])
    return v, {y + d for y in v for d in (-1, 1)} - v


def _range_make(width):
    def make(rng):
        lo = rng.randint(10, 900)
        return {"lo": lo, "hi": lo + width + 1}

    return make


def _range_sets(p):
    lo, hi = p["lo"], p["hi"]
    return set(range(lo + 1, hi)), {lo - 1, lo, hi, hi + 1}


def _neighbour_make(rng):
    return {"n": rng.randint(10, 999)}


def _neighbour_sets(p):
    n = p["n"]
    return {n - 1, n + 1}, {n, n - 2, n + 2}


def _proper_divisors(n: int) -> list[int]:
    return [d for d in range(2, n) if n % d == 0]


@lru_cache(maxsize=1)
def _divisor_numbers() -> tuple[int, ...]:
    return tuple(n for n in range(12, 1000) if len(_proper_divisors(n)) >= 4)


def _divisor_make(rng):
    return {"n": rng.choice(_divisor_numbers())}


def _divisor_sets(p):
    n = p["n"]
    v = set(_proper_divisors(n))
    return v, ({1, n} | {d + e for d in v for e in (-1, 1)}) - v


def _multiple_make(rng):
    while True:
        d = rng.randint(3, 12)
        lo = rng.randint(10, 150)
        hi = lo + d * rng.randint(6, 12)
        if len([x for x in range(lo + 1, hi) if x % d == 0]) >= 6:
            return {"d": d, "lo": lo, "hi": hi}


def _multiple_sets(p):
    d, lo, hi = p["d"], p["lo"], p["hi"]
    v = {x for x in range(lo + 1, hi) if x % d == 0}
    near = {x + e for x in v for e in (-1, 1)} | {x for x in (lo - lo % d, hi + (-hi) % d) if x % d == 0}
    return v, near - v


NUMBER_SETS = {"product": _product_sets, "pick": _pick_sets, "range": _range_sets, "neighbour": _neighbour_sets,
               "divisor": _divisor_sets, "multiple": _multiple_sets}

TEXTS = {
    "product": lambda p: f"What is {p['a']} * {p['b']}? Reply with the result only.\n",
    "pick": lambda p: f"Name one of these numbers: {', '.join(map(str, p['nums']))}. Reply with the number only.\n",
    "range": lambda p: (f"Name a whole number strictly between {p['lo']} and {p['hi']}. "
                        "Reply with the number only.\n"),
    "neighbour": lambda p: (f"Name a whole number that differs from {p['n']} by exactly 1. "
                            "Reply with the number only.\n"),
    "divisor": lambda p: f"Name a divisor of {p['n']} other than 1 and {p['n']}. Reply with the number only.\n",
    "multiple": lambda p: (f"Name one multiple of {p['d']} between {p['lo']} and {p['hi']}. "
                           "Reply with the number only.\n"),
}


def _number_family(name, kind, make, description, control=False):
    sets = NUMBER_SETS[kind]

    def answers(p):
        v, near = sets(p)
        return _sorted(v), _sorted(x for x in near if x >= 0), _far(v, near, min(v))

    def grade(p, s):
        v, near = sets(p)
        return _grade_number(number(s), v, near)

    return Family(name, description, make, TEXTS[kind], answers, grade, control)


# ------------------------------------------------------------------ sum


def _sum_make(rng):
    n = rng.randint(10, 40)
    return {"n": n, "m": rng.randint(n // 2 + 1, n - 1)}


def _sum_parse(s: str) -> tuple[int, int] | None:
    m = re.fullmatch(r"\s*(\d+)\s*\+\s*(\d+)\s*\.?\s*", s)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _sum_grade(p, s):
    ab = _sum_parse(s)
    if ab is None:
        return WRONG
    a, b = ab
    if a + b == p["n"]:  # the right sum; a part of 0 or above the cap is a near miss
        return VALID if 1 <= min(a, b) and max(a, b) <= p["m"] else NEAR_MISS
    return NEAR_MISS if abs(a + b - p["n"]) == 1 and max(a, b) <= p["m"] else WRONG


def _sum_answers(p):
    n, m = p["n"], p["m"]
    valid = [f"{a} + {n - a}" for a in range(max(1, n - m), min(m, n - 1) + 1)]
    near = [f"0 + {n}", f"{n} + 0", f"{n - m - 1} + {m + 1}", f"{m} + {n - m + 1}"]
    return valid, near, [f"{n} + {n}", f"{n * 3} + 1", "none"]


# ------------------------------------------------------------------ letter

WORDS = tuple("""
apple river garden window yellow market pencil silver forest bottle castle orange planet rocket summer winter
spring autumn basket butter candle carpet dinner doctor engine family farmer finger flower friend guitar hammer
island jacket kettle ladder lemon marble mirror monkey needle number office parrot pepper pillow pocket rabbit
saddle school shadow shovel singer sister spider stream street sugar table teacher ticket tiger tomato travel
valley violin wallet water wizard zebra anchor bridge camera cherry circle cloud coffee copper cotton desert
dragon eagle feather fountain glove honey jungle kitten lantern meadow mountain nickel ocean paddle pirate
puzzle quiet rainbow saucer season signal socket spoon statue sunset thunder tunnel velvet village volcano
walnut whistle blanket button canyon chimney compass crystal dolphin harbor helmet insect jigsaw kingdom
lizard magnet muffin napkin oyster pebble pickle plumber pumpkin radish ribbon sandal scarf shelter skate
sparrow squirrel student tablet temple thimble trumpet turkey umbrella vessel wagon weasel yogurt acorn bamboo
beetle biscuit blossom breeze cabbage cactus cobweb cookie cradle daisy fabric falcon ferry fiddle goblin
gravel hazel icicle jelly juggler kennel lobster mango meteor nectar noodle orchard peanut penguin quiver
raven saddle salmon sheriff slipper sponge tractor tulip turnip vapor waffle whale willow zipper
""".split())


def _word_letters(w: str) -> list[str]:
    return sorted(set(w))


def _letter_make(rng):
    return {"word": rng.choice(WORDS)}


def _letter_sets(p):
    v = set(_word_letters(p["word"]))
    near = {chr(ord(c) + e) for c in v for e in (-1, 1)} - v
    return v, {c for c in near if c.isalpha() and c.islower()}


def _letter_grade(p, s):
    m = re.fullmatch(r"\s*['\"]?([A-Za-z])['\"]?\s*\.?\s*", s)
    if not m:
        return WRONG
    c = m.group(1).lower()
    v, near = _letter_sets(p)
    return VALID if c in v else NEAR_MISS if c in near else WRONG


def _letter_answers(p):
    v, near = _letter_sets(p)
    wrong = sorted(set("abcdefghijklmnopqrstuvwxyz") - v - near)[:2]
    return sorted(v), sorted(near), wrong + ["7", "none"]


# ------------------------------------------------------------------ mixture


def _mixture_make(rng):
    if rng.random() < 0.5:
        return {"kind": "product", **_product_make(rng)}
    return {"kind": "range", **_range_make(40)(rng)}


def _mixture_answers(p):
    return FAMILIES["product" if p["kind"] == "product" else "range40"].answers(p)


def _mixture_grade(p, s):
    return FAMILIES["product" if p["kind"] == "product" else "range40"].grade(p, s)


def _mixture_text(p):
    return TEXTS[p["kind"]](p)


# ------------------------------------------------------------------ registry

FAMILIES: dict[str, Family] = {f.name: f for f in [
    _number_family("product", "product", _product_make, "control: one answer (a * b), V_y|x = 0", control=True),
    _number_family("pick2", "pick", _pick_make(2), "one of 2 listed numbers"),
    _number_family("pick4", "pick", _pick_make(4), "one of 4 listed numbers"),
    _number_family("pick8", "pick", _pick_make(8), "one of 8 listed numbers"),
    _number_family("range3", "range", _range_make(3), "a number strictly between lo and hi: 3 answers"),
    _number_family("range10", "range", _range_make(10), "a number strictly between lo and hi: 10 answers"),
    _number_family("range40", "range", _range_make(40), "a number strictly between lo and hi: 40 answers"),
    _number_family("neighbour", "neighbour", _neighbour_make, "n - 1 or n + 1: 2 answers"),
    _number_family("divisor", "divisor", _divisor_make, "a divisor of n other than 1 and n: 4 or more answers"),
    _number_family("multiple", "multiple", _multiple_make, "a multiple of d between lo and hi: 6 to 12 answers"),
    Family("sum", "two positive numbers up to m adding up to n, 'a + b': 2m - n + 1 answers", _sum_make,
           lambda p: (f"Write two positive whole numbers, neither above {p['m']}, that add up to {p['n']}, "
                      "in the form a + b. Reply with the sum only.\n"), _sum_answers, _sum_grade),
    Family("letter", "a letter of a given word: its distinct letters", _letter_make,
           lambda p: f"Name a letter that appears in the word '{p['word']}'. Reply with the letter only.\n",
           _letter_answers, _letter_grade),
    Family("mixture", "half product prompts (1 answer), half range40 prompts (40 answers)", _mixture_make,
           _mixture_text, _mixture_answers, _mixture_grade),
]}

#: the families whose ratio the pre-registration measures (every family but the V_y|x = 0 control)
STUDY = [n for n, f in FAMILIES.items() if not f.control]


# ------------------------------------------------------------------ prompts and roles


@lru_cache(maxsize=None)
def prompt_pool(name: str, seed: int = 0) -> tuple[Item, ...]:
    """The family's distinct prompts, in a fixed order reproducible from ``seed`` (at most POOL_MAX)."""
    fam = FAMILIES[name]
    rng = random.Random(f"{name}:{seed}")
    seen: set[str] = set()
    out: list[Item] = []
    misses = 0
    while len(out) < POOL_MAX and misses < 2000:  # small spaces (letter) stop when new prompts stop coming
        p = fam.make(rng)
        text = fam.text(p)
        if text in seen:
            misses += 1
            continue
        seen.add(text)
        valid, near, wrong = fam.answers(p)
        out.append(Item(name, len(out), text, tuple(valid), tuple(near), tuple(wrong), p))
    return tuple(out)


def _order(name: str) -> list[int]:
    idx = list(range(len(prompt_pool(name))))
    random.Random(f"roles:{name}").shuffle(idx)
    return idx


def heldout_prompts(name: str, n: int = N_HELDOUT) -> list[Item]:
    """The fixed held-out prompts (the first ``n`` of N_HELDOUT; never trained on, never piloted)."""
    if n > N_HELDOUT:
        raise ValueError(f"{name}: {n} held-out prompts asked, the held-out set has {N_HELDOUT}")
    pool = prompt_pool(name)
    return [pool[i] for i in _order(name)[:n]]


def train_pool(name: str) -> list[Item]:
    """Every prompt outside the held-out set, in the fixed role order."""
    pool = prompt_pool(name)
    return [pool[i] for i in _order(name)[N_HELDOUT:]]


def pilot_prompts(name: str, n: int) -> list[Item]:
    """The prompts a pilot scores: the first ``n`` of the training pool."""
    tp = train_pool(name)
    if n > len(tp):
        raise ValueError(f"{name}: {n} pilot prompts asked, the training pool has {len(tp)}")
    return tp[:n]


def warm_prompts(name: str, n: int, n_pilot: int) -> list[Item]:
    """The prompts a warm-up trains on: the last ``n`` of the training pool, disjoint from the first
    ``n_pilot`` (the scored ones)."""
    tp = train_pool(name)
    if n + n_pilot > len(tp):
        raise ValueError(f"{name}: {n} warm-up + {n_pilot} pilot prompts asked, the training pool has {len(tp)}")
    return tp[len(tp) - n:]


def training_prompts(name: str, seed: int, n: int) -> list[Item]:
    """Seed ``seed``'s own ``n`` training prompts: a seeded draw from the training pool (never held out)."""
    tp = train_pool(name)
    if n > len(tp):
        raise ValueError(f"{name}: {n} training prompts asked, the training pool has {len(tp)}")
    return random.Random(f"train:{name}:{seed}").sample(tp, n)
