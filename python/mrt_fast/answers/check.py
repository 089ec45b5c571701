"""Checkers: an answer key against a reference, as a score in [0, 1], and the reward it gives.

=============  ============================================================================
``"exact"``    the keys are equal (both normalised the same way: ``0.5`` = ``1/2`` = ``.50``)
``"numeric"``  both keys are numbers within ``abs_tol`` or ``rel_tol`` of the reference
               (keys that are no numbers are compared exactly)
``"set"``      the key is one of the reference's answers (a list, or a JSON array in a string)
a callable     ``fn(key, reference) -> bool | float`` in [0, 1] (a float is partial credit)
=============  ============================================================================

A reference is normalised as an answer (``\\boxed{...}`` and ``#### ...`` in it are
read, then its key taken with the extractor's normaliser); a null reference scores
nothing and is counted. :class:`Rewards` turns a score into the reward: ``correct``
for a full score, ``wrong`` for zero, in between by the fraction when ``partial``
(else ``wrong``), and ``missing`` for a response with no answer.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Callable

from mrt_fast.answers.extract import Extractor, find_boxed, find_choice
from mrt_fast.answers.keys import parse_number
from mrt_fast.errors import MrtInputError

__all__ = ["CHECKS", "Checker", "Rewards", "checker"]

CHECKS = ("exact", "numeric", "set")


@dataclass(frozen=True)
class Rewards:
    """The reward of each verdict; ``partial``: a fractional score gives the reward in between."""

    correct: float = 1.0
    wrong: float = 0.0
    missing: float = 0.0
    partial: bool = True

    def __post_init__(self) -> None:
        for name in ("correct", "wrong", "missing"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise MrtInputError(f"reward for {name} must be a finite number, got {v!r}")

    def of(self, score: float | None) -> float:
        if score is None:
            return float(self.missing)
        if score >= 1.0:
            return float(self.correct)
        if score <= 0.0 or not self.partial:
            return float(self.wrong)
        return float(self.wrong + score * (self.correct - self.wrong))


@dataclass(frozen=True)
class Checker:
    """A reference check (see the module doc). Picklable when ``fn`` is."""

    kind: str = "exact"
    abs_tol: float = 1e-9
    rel_tol: float = 1e-6
    fn: Callable[[Any, Any], Any] | None = None

    def reference_keys(self, value: Any, ex: Extractor) -> Any:
        """The key (a set of keys for ``set``) of a reference value; None for a null reference."""
        if value is None:
            return None
        if self.kind == "callable":
            return value
        if self.kind == "set":
            items = value
            if isinstance(value, str):
                try:
                    items = json.loads(value)
                except ValueError:
                    items = [value]
                if not isinstance(items, list):
                    items = [value]
            elif not isinstance(value, (list, tuple)):
                items = [value]
            keys = {reference_key(v, ex) for v in items if v is not None}
            keys.discard(None)
            return frozenset(keys) or None
        return reference_key(value, ex)

    def score(self, key: str | None, ref: Any) -> float | None:
        """The score of ``key`` against the reference ``ref`` (from :meth:`reference_keys`);
        None when there is no answer."""
        if key is None:
            return None
        if self.kind == "callable":
            v = self.fn(key, ref)
            if isinstance(v, bool):
                return 1.0 if v else 0.0
            if not isinstance(v, (int, float)) or not math.isfinite(v) or not 0.0 <= v <= 1.0:
                raise ValueError(f"returned {v!r}, not a bool or a number in [0, 1]")
            return float(v)
        if ref is None:
            return 0.0
        if self.kind == "set":
            return 1.0 if key in ref else 0.0
        if key == ref:
            return 1.0
        if self.kind == "numeric":
            a, b = parse_number(key), parse_number(ref)
            if a is not None and b is not None:
                return 1.0 if abs(float(a) - float(b)) <= max(self.abs_tol, self.rel_tol * abs(float(b))) else 0.0
        return 0.0

    def describe(self) -> dict:
        if self.kind == "callable":
            return {"check": f"callable:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"}
        if self.kind == "numeric":
            return {"check": "numeric", "abs_tol": self.abs_tol, "rel_tol": self.rel_tol}
        return {"check": self.kind}


def reference_key(value: Any, ex: Extractor) -> str | None:
    """A reference answer's key, normalised as the extractor normalises answers."""
    if value is None:
        return None
    if ex.kind == "choice":
        s = str(value).strip()
        return find_choice(s, ex.arg or "ABCDE") or (s.upper() or None)
    if isinstance(value, str):
        boxed = find_boxed(value)
        if boxed is not None:
            value = boxed
        elif "####" in value:
            value = value.rsplit("####", 1)[1]
    elif ex.kind != "json" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = repr(value)
    return ex.key(value)


def checker(check: Any = "exact", *, abs_tol: float | None = None, rel_tol: float | None = None) -> Checker:
    """A :class:`Checker` from ``"exact"``, ``"numeric"``, ``"set"`` or a callable."""
    for name, v in (("abs_tol", abs_tol), ("rel_tol", rel_tol)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                              or v < 0):
            raise MrtInputError(f"{name} must be a finite number >= 0, got {v!r}")
    if isinstance(check, Checker):
        return check
    if callable(check):
        return Checker("callable", fn=check)
    if check not in CHECKS:
        raise MrtInputError(f"check must be one of {CHECKS} or a callable, got {check!r}")
    if check != "numeric" and (abs_tol is not None or rel_tol is not None):
        raise MrtInputError(f"abs_tol and rel_tol apply to check='numeric' only, not {check!r}")
    kw = {k: float(v) for k, v in (("abs_tol", abs_tol), ("rel_tol", rel_tol)) if v is not None}
    return Checker(check, **kw)
