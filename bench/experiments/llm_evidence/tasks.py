"""Three prompt families with known answer sets, generated in code (no data is read or downloaded).

Each family gives, for every prompt, the full set of valid responses and a
checker. Prompts are split into training and held-out prompts; every prompt's
valid responses are split into a candidate pool (what a selector may keep) and
held-out references (for the reference loss).

* ``product`` (unique answer, V_y|x = 0): "What is a x b?" The answer is
  one number. Responses are draws from the answer set, so K draws are K
  copies of the answer (V_y|x = 0: the control where more responses buy nothing).
* ``multiple`` (in between): "Name a multiple of d between lo and hi." Several
  valid numbers, each a short, equally plausible response.
* ``expression`` (many equally valid answers, high V_y|x): "Write an expression
  equal to n." Any ``a + b``, ``a - b`` or ``a * b`` with value n.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Callable

import polars as pl

PRODUCT_DRAWS = 12  # the answer set has one element: any number of draws from it are copies of it


@dataclass
class Prompt:
    prompt_id: str
    prompt: str
    valid: list[str]  # draws from the valid answers (each once, shuffled; `product`: copies of its one answer)
    check: Callable[[str], bool] = field(repr=False)


@dataclass
class Task:
    name: str
    description: str
    prompts: list[Prompt]


def _product(rng: random.Random, i: int) -> Prompt:
    a, b = rng.randint(11, 99), rng.randint(2, 9)
    v = a * b
    valid = [str(v)] * PRODUCT_DRAWS

    def check(s: str, v=v) -> bool:
        nums = re.findall(r"-?\d+", s)
        return bool(nums) and int(nums[-1]) == v

    return Prompt(f"product-{i}", f"What is {a} * {b}? Reply with the result only.\n", valid, check)


def _multiple(rng: random.Random, i: int) -> Prompt:
    while True:
        d = rng.randint(3, 12)
        lo = rng.randint(10, 150)
        hi = lo + d * rng.randint(6, 12)
        vals = [x for x in range(lo + 1, hi) if x % d == 0]
        if len(vals) >= 6:
            break
    valid = [str(x) for x in vals]
    rng.shuffle(valid)

    def check(s: str, d=d, lo=lo, hi=hi) -> bool:
        m = re.match(r"\s*(-?\d+)", s)
        return bool(m) and lo < int(m.group(1)) < hi and int(m.group(1)) % d == 0

    return Prompt(f"multiple-{i}", f"Name one multiple of {d} between {lo} and {hi}. Reply with the number only.\n",
                  valid, check)


def _expression(rng: random.Random, i: int) -> Prompt:
    n = rng.randint(24, 199)
    exprs = {f"{a} + {n - a}" for a in range(1, n)}
    exprs |= {f"{n + b} - {b}" for b in range(1, 100)}
    exprs |= {f"{a} * {n // a}" for a in range(2, n) if n % a == 0}
    valid = sorted(exprs)
    rng.shuffle(valid)

    def check(s: str, n=n) -> bool:
        m = re.fullmatch(r"\s*(\d+)\s*([-+*x])\s*(\d+)\s*\.?\s*", s)
        if not m:
            return False
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return {"+": a + b, "-": a - b, "*": a * b, "x": a * b}[op] == n

    return Prompt(f"expression-{i}", f"Write an arithmetic expression with two numbers whose value is {n}. "
                  "Reply with the expression only.\n", valid, check)


FAMILIES = {
    "product": ("unique answer (one number; K draws are K copies)", _product),
    "multiple": ("in between (a handful of valid numbers)", _multiple),
    "expression": ("many equally valid answers (any two-number expression)", _expression),
}


def build_task(name: str, n_prompts: int, seed: int = 0) -> Task:
    """``n_prompts`` distinct prompts of family ``name``, reproducible from ``seed``."""
    desc, make = FAMILIES[name]
    rng = random.Random(f"{name}:{seed}")
    seen, out = set(), []
    while len(out) < n_prompts:
        p = make(rng, len(out))
        if p.prompt not in seen:
            seen.add(p.prompt)
            out.append(p)
    return Task(name, desc, out)


@dataclass
class Split:
    """Candidate pools of the training prompts, pilot pools, and held-out prompts with references."""

    task: Task
    train: list[Prompt]
    heldout: list[Prompt]
    pool_size: int
    n_refs: int

    def candidates(self, prompts: list[Prompt] | None = None) -> pl.DataFrame:
        """One row per candidate: the first ``pool_size`` valid responses of each prompt."""
        rows = [(p.prompt_id, p.prompt, r, j) for p in (prompts or self.train)
                for j, r in enumerate(p.valid[: self.pool_size])]
        return pl.DataFrame(rows, schema=["prompt_id", "prompt", "response", "candidate_index"], orient="row")

    def references(self) -> pl.DataFrame:
        """Held-out prompts, each with ``n_refs`` valid responses not in any pool (the reference set)."""
        return pl.DataFrame({
            "prompt_id": [p.prompt_id for p in self.heldout],
            "prompt": [p.prompt for p in self.heldout],
            "reference": [p.valid[-self.n_refs:] for p in self.heldout],
        })


def split_task(task: Task, n_train: int, n_heldout: int, pool_size: int = 8, n_refs: int = 4) -> Split:
    if n_train + n_heldout > len(task.prompts):
        raise ValueError(f"{task.name}: {n_train}+{n_heldout} prompts asked, {len(task.prompts)} built")
    return Split(task, task.prompts[:n_train], task.prompts[n_train:n_train + n_heldout], pool_size, n_refs)
