"""Equivalent ways of writing a rational, for the property tests of answer keys and checkers."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import strategies as st

rationals = st.fractions(min_value=-10**6, max_value=10**6, max_denominator=10**4)


def forms(v: Fraction) -> list[str]:
    """Ways of writing ``v`` that all mean it."""
    sign = "-" if v < 0 else ""
    a = abs(v)
    out = [f"{sign}{a.numerator}/{a.denominator}", f"{sign}\\frac{{{a.numerator}}}{{{a.denominator}}}",
           f"{sign}\\dfrac{{{a.numerator}}}{{{a.denominator}}}", f"$ {sign}{a.numerator} / {a.denominator} $",
           f"{sign}{2 * a.numerator}/{2 * a.denominator}"]
    if a.denominator == 1:
        n = a.numerator
        out += [f"{sign}{n}", f"{sign}{n:,}", f"{sign}{n}.0", f"{sign}{n}.000", f"{sign}{n:,}.00",
                f"\\boxed{{{sign}{n}}}"[7:-1], f"{sign}{n}\\,", f"{sign}{n}."]
    d = a.denominator
    if d and all(p in (2, 5) for p in _factors(d)):  # a terminating decimal
        digits = 0
        while (a * 10**digits).denominator != 1:
            digits += 1
        text = f"{float(a):.{digits}f}"
        out += [f"{sign}{text}", f"{sign}{text}0" if "." in text else f"{sign}{text}.0"]
        if text.startswith("0."):
            out.append(f"{sign}{text[1:]}")
    return out


def _factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])
