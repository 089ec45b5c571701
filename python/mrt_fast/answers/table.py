"""``answers(table, ...)``: answer keys, modes and checker rewards of every response of a table.

Adds per response (flat layout: one row per response; grouped: one list per
prompt, in the order of its responses):

* ``answer`` (str): the normalised answer key (:mod:`mrt_fast.answers.keys`), null
  when the response has none;
* ``mode`` (int64): the answer's code, a 63-bit digest of the key, so equal
  answers share a mode in every pool, part and run and ``select(...,
  method="stratified")`` needs no embeddings; a response with no answer gets a
  code of its own text (it joins no answer's mode);
* with a reference column or tests: ``reward`` (float) and ``correct`` (bool,
  full credit).

Pools with no learning signal (:mod:`mrt_fast.answers.report`) can be dropped
(``drop_zero_signal=True``) or capped (a float: the share of them kept, chosen
by a digest of the prompt id, so the choice does not depend on parts or order).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from mrt_fast.answers.check import Checker, Rewards, checker
from mrt_fast.answers.extract import Extractor, extractor
from mrt_fast.answers.report import AnswerReport, fill, pool_stats, zero_signal_mask
from mrt_fast.errors import MrtInputError

__all__ = ["AnswerOptions", "answers", "apply", "mode_code"]

_MASK = (1 << 63) - 1


def mode_code(key: str | None, response: str | None) -> int:
    """The mode of a response: a digest of its answer key, or of its own text when it has none."""
    data = b"a\0" + key.encode() if key is not None else b"n\0" + (response or "").encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & _MASK


@dataclass(frozen=True)
class AnswerOptions:
    """Every knob of an answers run (what the dataset stage records and ships to workers)."""

    extract: Extractor
    check: Checker
    rewards: Rewards = Rewards()
    reference: str | None = None
    tests: str | None = None
    by: str = "prompt_id"
    response: str = "response"
    answer: str = "answer"
    mode: str = "mode"
    reward: str = "reward"
    correct: str = "correct"
    layout: str = "auto"
    drop_zero_signal: bool | float = False
    sandbox: dict = field(default_factory=dict)
    workers: int = 1

    @property
    def rewarded(self) -> bool:
        return self.reference is not None or self.tests is not None

    @property
    def keep_share(self) -> float:
        """Share of zero-signal pools kept (1: all, 0: none)."""
        d = self.drop_zero_signal
        return 1.0 if d is False else 0.0 if d is True else float(d)

    def added(self) -> list[str]:
        return [self.answer, self.mode] + ([self.reward, self.correct] if self.rewarded else [])

    def parameters(self) -> dict:
        """What the result depends on, as JSON values (a job's parameters)."""
        return {"extract": self.extract.describe(), "normalize": str(self.extract.normalize),
                **self.check.describe(), "rewards": [self.rewards.correct, self.rewards.wrong, self.rewards.missing,
                                                     self.rewards.partial],
                "reference": self.reference, "tests": self.tests, "by": self.by, "response": self.response,
                "columns": self.added(), "drop_zero_signal": self.drop_zero_signal,
                "sandbox": {k: v for k, v in sorted(self.sandbox.items())}}


def options(*, extract: Any = "last_number", reference: str | None = None, tests: str | None = None,
            check: Any = "exact", abs_tol: float | None = None, rel_tol: float | None = None,
            normalize: Any = None, partial: bool = True, reward_correct: float = 1.0, reward_wrong: float = 0.0,
            reward_missing: float = 0.0, by: str = "prompt_id", response: str = "response", answer: str = "answer",
            mode: str = "mode", reward: str = "reward", correct: str = "correct", layout: str = "auto",
            drop_zero_signal: bool | float = False, sandbox: dict | None = None, workers: int = 1) -> AnswerOptions:
    """:class:`AnswerOptions` from the keywords of :func:`answers`, checked (one-line errors)."""
    from mrt_fast.tables.layouts import check_layout

    ex = extractor(extract, normalize)
    if ex.kind == "code" and tests is None:
        raise MrtInputError("extract='code' runs programs on test inputs: give tests= (the column of tests)")
    if tests is not None and ex.kind != "code":
        raise MrtInputError(f"tests= runs programs: it needs extract='code', not {ex.describe()!r}")
    if ex.kind == "code" and reference is not None:
        raise MrtInputError("extract='code' is checked against the tests' expected outputs; leave reference out")
    if isinstance(drop_zero_signal, bool):
        pass
    elif not isinstance(drop_zero_signal, (int, float)) or not 0.0 <= drop_zero_signal <= 1.0:
        raise MrtInputError(f"drop_zero_signal must be True/False or the share of such prompts kept, in [0, 1], "
                            f"got {drop_zero_signal!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise MrtInputError(f"workers must be an integer >= 1, got {workers!r}")
    if sandbox is not None and not isinstance(sandbox, dict):
        raise MrtInputError(f"sandbox must be a dict of run_program limits, got {type(sandbox).__name__}")
    names = [answer, mode] + ([reward, correct] if reference is not None or tests is not None else [])
    if len(set(names)) != len(names):
        raise MrtInputError(f"the columns written must have distinct names, got {names}")
    written = dict(zip(names, ("answer", "mode", "reward", "correct")))
    for col, role in ((reference, "reference"), (tests, "tests")):
        if col in written:
            out = written[col]
            raise MrtInputError(f"the {role} column {col!r} is also the {out} column answers writes: name that "
                                f"one otherwise ({out}='{col}_key'; mrt answers --{out}-column {col}_key)", column=col)
    return AnswerOptions(extract=ex, check=checker(check, abs_tol=abs_tol, rel_tol=rel_tol),
                         rewards=Rewards(reward_correct, reward_wrong, reward_missing, bool(partial)),
                         reference=reference, tests=tests, by=by, response=response, answer=answer, mode=mode,
                         reward=reward, correct=correct, layout=check_layout(layout),
                         drop_zero_signal=drop_zero_signal, sandbox=dict(sandbox or {}), workers=workers)


def _said(e: Exception) -> str:
    from mrt_fast._util.messages import one_line

    return f"{type(e).__name__}: {one_line(e)}"


def check_columns(schema: pl.Schema, opts: AnswerOptions) -> str:
    """The layout of a table for ``opts``; missing or clashing columns are one line."""
    from mrt_fast.tables.layouts import detect

    names = list(schema.names())
    for col, role in ((opts.response, "response"), (opts.reference, "reference"), (opts.tests, "tests")):
        if col is not None and col not in names:
            raise MrtInputError(f"column {col!r} ({role}) not found; the table has columns {names}", column=col)
    clash = [c for c in opts.added() if c in names]
    if clash:
        raise MrtInputError(f"the table already has column(s) {clash} that answers writes; name the outputs "
                            "otherwise (answer=, mode=, reward=, correct=; --answer-column, ...)", column=clash[0])
    lay = detect(schema, {opts.response: 0}, opts.layout)
    t = schema[opts.response]
    inner = t.inner if isinstance(t, (pl.List, pl.Array)) else t
    if inner not in (pl.String, pl.Null):
        raise MrtInputError(f"column {opts.response!r} (response) must hold text, got {t}", column=opts.response)
    if opts.by not in names:
        raise MrtInputError(f"column {opts.by!r} (prompt id) not found; the table has columns {names}",
                            column=opts.by)
    return lay


def flat_columns(df: pl.DataFrame, opts: AnswerOptions, row_of=None) -> tuple[dict[str, pl.Series], AnswerReport]:
    """The new columns of flat rows ``df`` and the row counts of the report (pools not filled).
    ``row_of(i)``: the table row of flat row ``i`` (for errors; grouped tables)."""
    where = row_of or (lambda i: i)
    rep = AnswerReport(extract=opts.extract.describe(), responses=df.height)
    texts = df[opts.response].to_list()
    ex, ck = opts.extract, opts.check
    keys: list[str | None] = []
    scores: list[float | None] = []
    if ex.kind == "code":
        from mrt_fast.answers.code import parse_tests, run_tests
        from mrt_fast.sandbox import extract_code

        tests = [parse_tests(v, where(i), opts.tests) for i, v in enumerate(df[opts.tests].to_list())]
        progs = [extract_code(t) if t else None for t in texts]
        for key, frac, counts in run_tests(progs, tests, workers=opts.workers, limits=opts.sandbox):
            keys.append(key)
            scores.append(frac if key is not None else None)
            for s, n in counts.items():
                rep.statuses[s] = rep.statuses.get(s, 0) + n
    else:
        for i, t in enumerate(texts):
            try:
                keys.append(ex.key(ex.raw(t)))
            except MrtInputError:
                raise
            except Exception as e:  # noqa: BLE001 - a user function's failure, said with its row
                raise MrtInputError(f"the extract function raised {_said(e)} at row {where(i)} "
                                    f"(response {str(t)[:80]!r})", column=opts.response, row=where(i)) from None
        if opts.reference is not None:
            refs = df[opts.reference].to_list()
            ref_keys = {}
            for i, (k, r) in enumerate(zip(keys, refs)):
                if r is None:
                    rep.null_references += 1
                try:
                    rid = repr(r)
                    if rid not in ref_keys:
                        ref_keys[rid] = ck.reference_keys(r, ex)
                    scores.append(ck.score(k, ref_keys[rid]))
                except MrtInputError:
                    raise
                except Exception as e:  # noqa: BLE001
                    raise MrtInputError(f"the check function raised {_said(e)} at row {where(i)} (answer {k!r}, "
                                        f"reference {str(r)[:80]!r})", column=opts.reference, row=where(i)) from None
    rep.answered = sum(k is not None for k in keys)
    rep.unanswered = len(keys) - rep.answered
    cols = {opts.answer: pl.Series(opts.answer, keys, dtype=pl.String),
            opts.mode: pl.Series(opts.mode, [mode_code(k, t) for k, t in zip(keys, texts)], dtype=pl.Int64)}
    if opts.rewarded:
        rw = opts.rewards
        cols[opts.reward] = pl.Series(opts.reward, [rw.of(s) for s in scores], dtype=pl.Float64)
        cols[opts.correct] = pl.Series(opts.correct, [s is not None and s >= 1.0 for s in scores],
                                       dtype=pl.Boolean)
    return cols, rep


def _keep_pools(ids: pl.Series, zero: np.ndarray, share: float) -> np.ndarray:
    """Pools kept: every pool with signal, and a ``share`` of the others chosen by a digest of the id."""
    if share >= 1.0:
        return np.ones(len(ids), dtype=bool)
    from mrt_fast.tables.arrays import pool_keys

    u = pool_keys(ids).astype(np.float64) / 2.0**64
    return ~zero | (u < share)


def apply(df: pl.DataFrame, opts: AnswerOptions) -> tuple[pl.DataFrame, AnswerReport]:
    """``df`` (polars, either layout) with the new columns, zero-signal pools dropped as asked, and the report."""
    from mrt_fast.tables.layouts import GROUPED, attach, explode, grouped_row

    t0 = time.perf_counter()
    lay = check_columns(df.schema, opts)
    stat_cols = (opts.by, opts.mode, opts.reward if opts.rewarded else None,
                 opts.correct if opts.rewarded else None)
    if lay == GROUPED:
        keep = [c for c in dict.fromkeys([opts.by, opts.response, opts.reference, opts.tests]) if c is not None]
        flat = explode(df.select(keep), opts.by, [opts.response])
        lengths = df[opts.response].list.len() if isinstance(df.schema[opts.response], pl.List) \
            else df[opts.response].arr.len()
        cols, rep = flat_columns(flat, opts, row_of=lambda i: grouped_row(i, lengths))
        out = attach(df, [opts.response], cols)
        stats = pool_stats(flat.select(opts.by).with_columns(list(cols.values())), *stat_cols)
    else:
        cols, rep = flat_columns(df, opts)
        out = df.with_columns(list(cols.values()))
        stats = pool_stats(out.select(opts.by, *[c for c in cols]), *stat_cols)
    fill(rep, stats, opts.rewarded)
    if opts.keep_share < 1.0:
        zero = zero_signal_mask(stats, opts.rewarded).to_numpy()
        kept = _keep_pools(stats[opts.by], zero, opts.keep_share)
        rep.dropped_pools = int((~kept).sum())
        if rep.dropped_pools:
            rep.dropped_rows = int(stats.filter(~pl.Series(kept))["n"].sum())
            if lay == GROUPED:  # one row a pool, in the order of the stats
                out = out.filter(pl.Series(kept))
            else:
                gone = stats.filter(~pl.Series(kept))[opts.by]
                out = out.filter(~pl.col(opts.by).is_in(gone.implode()))
    rep.layout, rep.parts, rep.parts_done_now = lay, 1, 1
    rep.rows = rep.rows_done_now = df.height
    rep.rows_out = out.height
    rep.seconds = time.perf_counter() - t0
    return out, rep


def answers(table: Any, *, extract: Any = "last_number", reference: str | None = None, tests: str | None = None,
            check: Any = "exact", abs_tol: float | None = None, rel_tol: float | None = None, normalize: Any = None,
            partial: bool = True, reward_correct: float = 1.0, reward_wrong: float = 0.0,
            reward_missing: float = 0.0, by: str = "prompt_id", response: str = "response", answer: str = "answer",
            mode: str = "mode", reward: str = "reward", correct: str = "correct", layout: str = "auto",
            drop_zero_signal: bool | float = False, sandbox: dict | None = None, workers: int = 1,
            return_report: bool = False):
    """Answer keys, modes and (with ``reference`` or ``tests``) checker rewards of every response.

    ``table``: polars, pandas or Arrow, flat or grouped (``layout``). ``extract``: how to find the answer
    (:func:`mrt_fast.answers.extract.extractor`: ``"last_number"``, ``"boxed"``, ``"answer_line"``,
    ``"choice"``, ``"json:PATH"``, ``"regex:PATTERN"``, ``"code"`` or a callable); ``normalize``: ``"math"``,
    ``"text"``, ``"none"`` or a callable. ``reference``: the column of reference answers; ``check``:
    ``"exact"``, ``"numeric"`` (``abs_tol``, ``rel_tol``), ``"set"`` or ``fn(key, reference)``.
    ``tests`` (with ``extract="code"``): the column of test cases; programs run in the sandbox
    (``sandbox``: :func:`mrt_fast.sandbox.run_program`'s limits; ``workers`` programs at a time).
    Rewards: ``reward_correct``/``reward_wrong``/``reward_missing``, and ``partial`` credit in between.
    ``drop_zero_signal``: True drops the prompts with no learning signal, a float keeps that share.

    Returns a polars DataFrame (``(df, AnswerReport)`` with ``return_report``).
    """
    opts = options(extract=extract, reference=reference, tests=tests, check=check, abs_tol=abs_tol,
                   rel_tol=rel_tol, normalize=normalize, partial=partial, reward_correct=reward_correct,
                   reward_wrong=reward_wrong, reward_missing=reward_missing, by=by, response=response,
                   answer=answer, mode=mode, reward=reward, correct=correct, layout=layout,
                   drop_zero_signal=drop_zero_signal, sandbox=sandbox, workers=workers)
    df = as_polars(table)
    out, rep = apply(df, opts)
    return (out, rep) if return_report else out


def as_polars(table: Any) -> pl.DataFrame:
    if isinstance(table, pl.DataFrame):
        return table
    if isinstance(table, pl.LazyFrame):
        return table.collect()
    try:
        import pyarrow as pa

        if isinstance(table, (pa.Table, pa.RecordBatch)):
            return pl.from_arrow(table)
    except ImportError:  # pragma: no cover
        pass
    if type(table).__module__.startswith("pandas"):
        return pl.from_pandas(table)
    if isinstance(table, dict):
        return pl.DataFrame(table)
    raise MrtInputError(f"table must be a polars, pandas or Arrow table, got {type(table).__name__}")
