"""Answer keys: the normal form of an extracted answer, so that equal answers get equal keys.

``canonical(text)`` is the key of an answer string:

* LaTeX dressing is dropped: ``$``, ``\\(``/``\\)``, ``\\left``/``\\right``, spacing
  commands (``\\,`` ``\\!`` ``\\;`` ``\\quad`` ``~``), ``\\text{...}``/``\\mathrm{...}``
  (their content kept), ``\\dfrac``/``\\tfrac`` (as ``\\frac``), degree marks,
  a trailing full stop and a leading ``x =``;
* a number in any common form is one rational: a sign, thousands separators
  (``1,234`` ``1\\,234`` ``1 234``), decimals (``.50``), a fraction (``3/4``,
  ``\\frac{3}{4}``, ``\\frac34``), a percent sign (dropped) and an exponent
  (``1e3``) all give ``p/q`` in lowest terms (``"1/2"``, ``"-3"``, ``"0"``);
* anything else is its text with whitespace removed, unless the ``answers``
  extra (``math-verify``, which brings ``sympy``) is installed: then a
  mathematical expression (``\\sqrt{8}``, ``2\\sqrt{2}``, ``\\pi/2``) is parsed
  and simplified, and its key is the simplified expression, so that
  ``\\sqrt{8}`` and ``2\\sqrt{2}`` agree.

``text_key(text)`` is the key of a free-text answer (a JSON field, a regex
group): whitespace collapsed, case kept.
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

__all__ = ["canonical", "format_number", "has_math_verify", "parse_number", "strip_latex", "text_key"]

#: longest expression handed to the symbolic parser (longer ones keep their light key)
SYMBOLIC_LIMIT = 120

_SPACING = re.compile(r"\\(?:[,!;:> ]|quad|qquad|displaystyle|textstyle|left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
_WRAPPERS = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mathit|operatorname|mbox)\s*\{([^{}]*)\}")
_DEGREES = re.compile(r"\^\s*\{?\\circ\}?|°")
_LHS = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?\s*=\s*(?=\S)")
_NUMBER = re.compile(
    r"[-+−]?(?:\d{1,3}(?:,\d{3})+|\d{1,3}(?:[ \u2009\u202f]\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?$")
_FRACTION = re.compile(r"([-+−]?)\\frac\s*(?:\{([^{}]*)\}|(\d))\s*(?:\{([^{}]*)\}|(\d))$")


def strip_latex(text: str) -> str:
    """``text`` without LaTeX dressing (see the module doc), trimmed."""
    s = text.strip()
    s = s.replace("\\$", "$").strip("$").strip()
    for a, b in (("\\(", "\\)"), ("\\[", "\\]")):
        if s.startswith(a) and s.endswith(b):
            s = s[len(a):-len(b)]
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = _SPACING.sub(" ", s).replace("~", " ")
    for _ in range(3):  # nested wrappers, innermost first
        s2 = _WRAPPERS.sub(r"\1", s)
        if s2 == s:
            break
        s = s2
    s = _DEGREES.sub("", s)
    s = s.strip()
    while len(s) > 1 and s.endswith((".", "。", ",", ";", ":", "!")):
        s = s[:-1].rstrip()
    s = _LHS.sub("", s)
    return s.strip()


def parse_number(text: str) -> Fraction | None:
    """The rational a number written in ``text`` stands for (the whole text: see the module doc), or None."""
    s = text.strip().replace("−", "-")
    if s.endswith("%"):
        s = s[:-1].rstrip()
    if not s:
        return None
    m = _FRACTION.match(s)
    if m:
        num = parse_number(m.group(2) if m.group(2) is not None else m.group(3))
        den = parse_number(m.group(4) if m.group(4) is not None else m.group(5))
        if num is None or den is None or den == 0:
            return None
        v = num / den
        return -v if m.group(1) in ("-", "−") else v
    if "/" in s:
        a, _, b = s.partition("/")
        num, den = parse_number(a), parse_number(b)
        if num is None or den is None or den == 0 or b.strip().startswith(("-", "+")):
            return None
        return num / den
    if not _NUMBER.match(s) or not any(c.isdigit() for c in s):
        return None
    s = s.replace(",", "").replace(" ", "").replace("\u2009", "").replace("\u202f", "")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def format_number(v: Fraction) -> str:
    """A rational as its key: ``"p"`` or ``"p/q"`` in lowest terms (``-0`` is ``"0"``)."""
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


@functools.lru_cache(maxsize=1)
def has_math_verify() -> bool:
    """Whether the ``answers`` extra's symbolic parser (``math-verify`` with ``sympy``) is installed."""
    try:
        import math_verify  # noqa: F401
        import sympy  # noqa: F401
    except ImportError:
        return False
    return True


_MATHY = re.compile(r"\\[A-Za-z]+|\^|\bsqrt\b|\bpi\b")
_WORDS = re.compile(r"(?<!\\)\b[A-Za-z]{3,}\b")


def _looks_symbolic(s: str) -> bool:
    """A mathematical expression (a LaTeX command, a power, sqrt or pi) and no plain words of prose."""
    if len(s) > SYMBOLIC_LIMIT or not _MATHY.search(s):
        return False
    bare = re.sub(r"\\[A-Za-z]+", " ", s)
    return not any(w not in ("sqrt", "pi") for w in _WORDS.findall(bare))


@functools.lru_cache(maxsize=65536)
def _symbolic_key(s: str) -> str | None:
    """The key of a LaTeX expression through math-verify and sympy: a rational as `format_number`,
    anything else as the simplified expression; None when it does not parse."""
    import logging

    import sympy
    from math_verify import parse

    log = logging.getLogger("math_verify")
    level = log.level
    log.setLevel(logging.ERROR)  # it warns that no timeout is set: the length limit bounds the work
    try:
        parsed = parse(f"${s}$", parsing_timeout=None)
    except Exception:  # noqa: BLE001 - a parser failure means "no symbolic key", never an error
        return None
    finally:
        log.setLevel(level)
    expr = next((e for e in parsed if isinstance(e, sympy.Basic)), None)
    if expr is None:
        return None
    try:
        if expr.is_Rational:
            return format_number(Fraction(int(expr.p), int(expr.q)))
        if expr.is_Float:
            return format_number(Fraction(str(expr)))
        simple = sympy.simplify(expr.doit())
        if simple.is_Rational:
            return format_number(Fraction(int(simple.p), int(simple.q)))
        return sympy.sstr(simple, order="lex").replace(" ", "")
    except Exception:  # noqa: BLE001
        return None


def canonical(text: str | None, *, symbolic: bool | None = None) -> str | None:
    """The key of an answer string (see the module doc); None for None or an empty answer.

    ``symbolic``: use math-verify/sympy for expressions (default: when installed)."""
    if text is None:
        return None
    s = strip_latex(str(text))
    if not s:
        return None
    v = parse_number(s)
    if v is not None:
        return format_number(v)
    if symbolic is None:
        symbolic = has_math_verify()
    if symbolic and _looks_symbolic(s):
        k = _symbolic_key(s)
        if k is not None:
            return k
    return re.sub(r"\s+", "", s)


def text_key(text: str | None) -> str | None:
    """The key of a free-text answer: whitespace collapsed and trimmed; None when empty."""
    if text is None:
        return None
    s = " ".join(str(text).split())
    return s or None
