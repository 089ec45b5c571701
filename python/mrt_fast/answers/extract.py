"""Extractors: the answer a response reaches, as a string, and its key.

An :class:`Extractor` is built from a spec (:func:`extractor`):

========================  ==============================================================
``"last_number"``         the last number of the response (sign, thousands separators,
                          decimals, ``3/4``, ``\\frac{3}{4}``)
``"boxed"``               the content of the last ``\\boxed{...}`` (nested braces) or ``\\fbox{...}``
``"answer_line"``         the last line ``Answer: ...`` / ``Final answer: ...`` / ``#### ...``
                          (a boxed answer or a leading number in it is taken; units dropped)
``"choice"``              a multiple-choice letter (``"choice:ABCD"`` names the letters;
                          default A to E): ``\\boxed{B}``, ``answer is (B)``, ``Answer: B``,
                          the last ``(B)``, or a line holding only the letter
``"json:PATH"``           a field of the JSON object in the response (the whole text, a
                          fenced ```json block or the last ``{...}`` that parses); PATH is
                          dot-separated keys and list indices (``items.0.name``)
``"regex:PATTERN"``       group ``answer`` (or group 1) of the last match of PATTERN
a callable                ``fn(response) -> str | number | None``
========================  ==============================================================

The extracted string becomes a key by the extractor's ``normalize``: ``"math"``
(:func:`mrt_fast.answers.keys.canonical`, the default of every kind but
``choice`` and ``json``), ``"text"`` (whitespace collapsed), ``"none"`` (as it
is) or a callable ``fn(str) -> str | None``. A response with no answer gets
the key None.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable

from mrt_fast.answers.keys import canonical, format_number, parse_number, strip_latex, text_key
from mrt_fast.errors import MrtInputError

__all__ = ["KINDS", "Extractor", "extractor", "find_boxed", "find_choice", "find_json", "last_number"]

KINDS = ("last_number", "boxed", "answer_line", "choice", "json", "regex", "code", "callable")
NORMALIZERS = ("math", "text", "none")

_SIGNED = r"(?P<sign>[-+−]?)"
_TOKEN = re.compile(
    _SIGNED + r"(?:\\[dt]?frac\s*\{\s*(?P<fn>\d+)\s*\}\s*\{\s*(?P<fd>\d+)\s*\}"
    r"|(?P<num>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:\s*/\s*(?P<den>\d+)(?!\d|\.\d))?)")


def last_number(text: str) -> str | None:
    """The last number of ``text`` as written, its sign kept unless the minus reads as a subtraction
    (right after a letter, digit or closing bracket, or after a number and a space); None when none."""
    last = None
    for m in _TOKEN.finditer(text):
        last = m
    if last is None:
        return None
    sign = last.group("sign")
    if sign:  # not a sign right after a word or a closing bracket, nor after a number and a space (5 - 3)
        at = last.start()
        prev = text[at - 1] if at else ""
        rest = text[:at].rstrip()
        after_term = prev and (prev.isalnum() or prev in ")]}")
        after_number = prev.isspace() and rest and (rest[-1].isdigit() or rest[-1] in ")]}")
        if after_term or after_number:
            sign = ""
    sign = "-" if sign in ("-", "−") else ""
    if last.group("fn") is not None:
        return f"{sign}{last.group('fn')}/{last.group('fd')}"
    num = last.group("num")
    return f"{sign}{num}" + (f"/{last.group('den')}" if last.group("den") else "")


def find_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` or ``\\fbox{...}`` (braces matched), or of a
    ``\\boxed 5`` without braces; None when there is none or its braces do not close."""
    at = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if at < 0:
        return None
    i = at + (6 if text.startswith("\\boxed", at) else 5)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text):
        return None
    if text[i] != "{":
        m = re.match(r"[^\s$]+", text[i:])
        return m.group(0) if m else None
    depth, start = 0, i + 1
    for j in range(i, len(text)):
        c = text[j]
        if c == "{" and text[j - 1] != "\\":
            depth += 1
        elif c == "}" and text[j - 1] != "\\":
            depth -= 1
            if depth == 0:
                return text[start:j]
    return None


_ANSWER_LINE = re.compile(r"^\s*(?:\*\*)?(?:the\s+)?(?:final\s+)?answer(?:\*\*)?\s*(?:is\s*)?[:：]\s*(?:\*\*)?(.+?)"
                          r"(?:\*\*)?\s*$|^\s*####\s*(.+?)\s*$", re.I | re.M)
_LEADING_NUMBER = re.compile(r"^([-+−]?[\d.,]+(?:\s*/\s*\d+)?)\s+[A-Za-z%$].*$")


def answer_line(text: str) -> str | None:
    """The content of the last ``Answer: ...`` / ``Final answer: ...`` / ``#### ...`` line."""
    last = None
    for m in _ANSWER_LINE.finditer(text):
        last = m
    if last is None:
        return None
    s = (last.group(1) or last.group(2) or "").strip()
    boxed = find_boxed(s)
    if boxed is not None:
        return boxed
    s = strip_latex(s)
    if parse_number(s) is None:
        m = _LEADING_NUMBER.match(s)  # "408 apples": the number, not the unit
        if m and parse_number(m.group(1)) is not None:
            return m.group(1)
    return s or None


def find_choice(text: str, letters: str = "ABCDE") -> str | None:
    """A multiple-choice letter out of ``letters`` (see the module doc), upper case; None when none."""
    L = re.escape(letters.upper()) if letters else "A-E"
    cls = f"[{L}{L.lower()}]"
    boxed = find_boxed(text)
    if boxed is not None:
        m = re.fullmatch(rf"\s*(?:\\text\{{)?\(?({cls})\)?\}}?\s*", boxed)
        if m:
            return m.group(1).upper()
    patterns = [
        rf"(?i:answer|option|choice)\s*(?:is|:|：)?\s*(?:\*\*)?\s*[\(\[]?({cls})(?![A-Za-z])",
        rf"\(({cls})\)",
        rf"^\s*[\(\[]?({cls})[\)\].:]?\s*$",
    ]
    for pat in patterns:
        found = None
        for m in re.finditer(pat, text, re.M):
            found = m
        if found is not None:
            letter = found.group(1)
            # a lower-case letter counts only after an explicit "answer is"
            if letter.isupper() or pat is patterns[0]:
                return letter.upper()
    return None


def _json_candidates(text: str):
    s = text.strip()
    yield s
    for m in re.finditer(r"```(?:json)?\s*\n(.*?)```", text, re.S):
        yield m.group(1)
    starts = [i for i, c in enumerate(text) if c == "{"]
    for i in reversed(starts[-64:]):  # the last object that parses
        depth = 0
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    yield text[i:j + 1]
                    break


def find_json(text: str) -> Any:
    """The JSON value in ``text`` (see the module doc); raises LookupError when none parses."""
    for cand in _json_candidates(text):
        try:
            return json.loads(cand)
        except ValueError:
            continue
    raise LookupError("no JSON")


def json_field(value: Any, path: list[str]) -> Any:
    """``value`` at ``path`` (keys and list indices); raises LookupError when it is not there."""
    for p in path:
        if isinstance(value, dict) and p in value:
            value = value[p]
        elif isinstance(value, list) and re.fullmatch(r"-?\d+", p) and -len(value) <= int(p) < len(value):
            value = value[int(p)]
        else:
            raise LookupError(p)
    return value


def json_key(value: Any) -> str | None:
    """A JSON value as a key: strings by whitespace, numbers as rationals, anything else as compact JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return text_key(value)
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        v = parse_number(repr(value)) if isinstance(value, float) else None
        return format_number(v) if v is not None else str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Extractor:
    """How to find the answer of a response (see the module doc). Picklable when ``fn`` is."""

    kind: str
    arg: Any = None
    normalize: Any = "math"
    fn: Callable[[str], Any] | None = None

    def raw(self, text: str | None) -> Any:
        """The answer as found in ``text`` (a string, or a JSON value), or None."""
        if text is None:
            return None
        k = self.kind
        if k == "last_number":
            return last_number(text)
        if k == "boxed":
            return find_boxed(text)
        if k == "answer_line":
            return answer_line(text)
        if k == "choice":
            return find_choice(text, self.arg or "ABCDE")
        if k == "json":
            try:
                return json_field(find_json(text), self.arg)
            except LookupError:
                return None
        if k == "regex":
            last = None
            for m in self.arg.finditer(text):
                last = m
            if last is None:
                return None
            return last.group("answer") if "answer" in self.arg.groupindex else last.group(1)
        if k == "callable":
            return self.fn(text)
        raise MrtInputError(f"extractor {k!r} does not read text")  # code: run, not read

    def key(self, value: Any) -> str | None:
        """The key of an extracted value."""
        if value is None:
            return None
        if self.kind == "json" and self.normalize == "text":
            return json_key(value)
        if not isinstance(value, str):
            value = json_key(value) if not isinstance(value, (int, float)) or isinstance(value, bool) \
                else str(value)
        norm = self.normalize
        if callable(norm):
            out = norm(value)
            return None if out is None else str(out)
        if norm == "math":
            return canonical(value)
        if norm == "text":
            return text_key(value)
        return value if value != "" else None

    def describe(self) -> str:
        """The spec this extractor was made from (for manifests and reports)."""
        if self.kind == "callable":
            return f"callable:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', '?')}"
        if self.kind == "json":
            return "json:" + ".".join(self.arg)
        if self.kind == "regex":
            return "regex:" + self.arg.pattern
        if self.kind == "choice" and self.arg:
            return "choice:" + self.arg
        return self.kind


_ALIASES = {"number": "last_number", "last-number": "last_number", "answer": "answer_line",
            "answer-line": "answer_line", "mc": "choice", "multiple_choice": "choice"}


def extractor(spec: Any, normalize: Any = None) -> Extractor:
    """An :class:`Extractor` from a spec (see the module doc); bad specs are one-line `MrtInputError`s."""
    if normalize is not None and not callable(normalize) and normalize not in NORMALIZERS:
        raise MrtInputError(f"normalize must be one of {NORMALIZERS} or a callable, got {normalize!r}")
    if isinstance(spec, Extractor):
        return spec if normalize is None else Extractor(spec.kind, spec.arg, normalize, spec.fn)
    if callable(spec):
        return Extractor("callable", None, normalize or "math", spec)
    if not isinstance(spec, str) or not spec.strip():
        raise MrtInputError(f"extract must be one of {[k for k in KINDS if k != 'callable']} (json:PATH, "
                            f"regex:PATTERN, choice:LETTERS) or a callable, got {spec!r}")
    kind, sep, arg = spec.partition(":")
    kind = _ALIASES.get(kind.strip().lower(), kind.strip().lower())
    if kind == "regex":
        if not sep or not arg:
            raise MrtInputError("extract 'regex:PATTERN' needs a pattern after 'regex:'")
        try:
            rx = re.compile(arg, re.M)
        except re.error as e:
            raise MrtInputError(f"extract regex {arg!r} does not compile: {e}") from None
        if rx.groups == 0:
            raise MrtInputError(f"extract regex {arg!r} has no group: put the answer in a group, e.g. "
                                r"'Answer: (\d+)', or name it (?P<answer>...)")
        return Extractor("regex", rx, normalize or "math")
    if kind == "json":
        path = [p for p in arg.split(".")] if arg else []
        if not sep or not arg or any(p == "" for p in path):
            raise MrtInputError(f"extract 'json:PATH' needs a dot-separated field path (e.g. json:answer.value), "
                                f"got {spec!r}")
        return Extractor("json", path, normalize or "text")
    if kind == "choice":
        letters = arg.strip().upper() if sep else ""
        if sep and (not letters or not letters.isalpha() or len(set(letters)) != len(letters)):
            raise MrtInputError(f"extract 'choice:LETTERS' needs distinct letters (e.g. choice:ABCD), got {spec!r}")
        return Extractor("choice", letters or None, normalize or "none")
    if kind in ("last_number", "boxed", "answer_line", "code") and not sep:
        return Extractor(kind, None, normalize or "math")
    raise MrtInputError(f"unknown extract {spec!r}: use last_number, boxed, answer_line, choice[:LETTERS], "
                        "json:PATH, regex:PATTERN, code, or a callable")
