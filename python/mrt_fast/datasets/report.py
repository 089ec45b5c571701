"""What a job did: one report for every stage, the same names, printed one way.

:class:`JobReport` holds what every stage's run has: the output, the engine
and the layout, the parts of the job and those done by this run, the input
rows (prompts in the grouped layout) of the job and of this run, the rows the
output holds, whether the run resumed a job or found it done, the seconds,
Ray's log directory and the notes. Each stage's report derives from it and
adds its own counts: :class:`BatchReport` (select),
:class:`mrt_fast.embeddings.dataset.EmbedReport` (embed),
:class:`mrt_fast.llm.dataset_stages.StageReport` (nll, score) and
:class:`mrt_fast.answers.report.AnswerReport` (answers).

``print(report)`` shows a short table (the stage's lines, then the parts, the
rows and the seconds), with a line saying what this run did beside what the
job holds when it resumed one; a job found complete is one line.
``to_dict()`` gives the fields and rates for JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from mrt_fast.selection.report import pick_lines, summary_text

__all__ = ["BatchReport", "JobReport", "run_summary"]


def run_summary(this_run: dict[str, int], total: dict[str, int]) -> str:
    """What a run did beside what the job holds: ``this run: 2 parts, 10 rows; job total: 4 parts, 18 rows``
    (each a mapping of what is counted to its count, in order)."""
    def said(d: dict[str, int]) -> str:
        return ", ".join(f"{v:,} {k}" for k, v in d.items())

    return f"this run: {said(this_run)}; job total: {said(total)}"


@dataclass(repr=False)
class JobReport:
    """What a run of a stage over a dataset did (see the module doc).

    ``parts``: the job's parts (1 for a file output); ``parts_done_now``: those this run did;
    ``rows``: the input rows (prompts in the grouped layout); ``rows_done_now``: those of the
    parts this run did; ``rows_out``: the rows the output holds; ``resumed``: this run
    finished a job an earlier run started; ``already_done``: it found the job complete and
    did nothing; ``logs``: Ray's log directory when the job sent Ray's own lines there;
    ``notes``: what the job did beside its work, or could not do, one line each."""

    output: str = ""
    engine: str = "local"
    layout: str = "flat"
    parts: int = 0
    parts_done_now: int = 0
    rows: int = 0
    rows_done_now: int = 0
    rows_out: int = 0
    resumed: bool = False
    already_done: bool = False
    seconds: float = 0.0
    logs: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def unit(self) -> str:
        """What an input row is: ``rows``, or ``prompts`` in the grouped layout."""
        return "prompts" if self.layout == "grouped" else "rows"

    @property
    def nothing_to_do(self) -> bool:
        """Whether the run found every part done (the job complete, or only its end missing)."""
        return self.already_done or (self.resumed and self.parts_done_now == 0)

    @property
    def rows_per_second(self) -> float:
        """Input rows this run did per second."""
        return self.rows_done_now / self.seconds if self.seconds > 0 else float("nan")

    def stage_lines(self) -> list[tuple[str, str]]:
        """The stage's own (label, value) rows, before the job's."""
        return []

    def lines(self) -> list[tuple[str, str]]:
        """The report as (label, value) rows: what ``str(report)`` and the commands print."""
        parts = f"{self.parts:,}" + (f" ({self.parts_done_now:,} by this run)" if self.resumed else "")
        return self.stage_lines() + [(self.unit, f"{self.rows:,}"), ("parts", parts),
                                     ("seconds", f"{self.seconds:.2f}")]

    def run_summary(self) -> str:
        """What this run did beside what the job holds (:func:`run_summary`)."""
        u = self.unit
        return run_summary({"parts": self.parts_done_now, u: self.rows_done_now}, {"parts": self.parts, u: self.rows})

    def complete_line(self) -> str:
        """The one line of a run that found nothing to do."""
        return (f"{self.output} is already complete ({self.parts:,} part(s), {self.rows_out:,} {self.unit} "
                "written); nothing to do")

    def __str__(self) -> str:
        if self.nothing_to_do:
            return self.complete_line()
        text = summary_text(type(self).__name__, self.lines())
        if self.resumed:
            text += "\n" + self.run_summary()
        return text + (f"\nRay's logs: {self.logs}" if self.logs else "")

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(output={self.output!r}, engine={self.engine!r}, parts={self.parts}, "
                f"parts_done_now={self.parts_done_now}, rows={self.rows}, rows_out={self.rows_out}, "
                f"seconds={self.seconds:.2f})")

    def to_dict(self) -> dict:
        return {**asdict(self), "rows_per_second": self.rows_per_second}


@dataclass(repr=False)
class BatchReport(JobReport):
    """What a `select_dataset` run did; ``print(report)`` shows it as a short
    table (the lines of ``mrt select``'s summary). ``n_parts``, ``n_input_rows`` and
    ``n_out_rows`` are other names of ``parts``, ``rows`` and ``rows_out``."""

    method: str = ""
    k: int | str = 0
    n_pools: int = 0
    n_candidates: int = 0
    n_kept: int = 0  # kept candidates (rows of the output in the flat layout)
    n_small_pools: int = 0
    modes_missed: int = 0
    mean_ratio: float | None = None
    spilled: bool = False
    in_place: bool = False  # parts of consecutive pools read from the input, no exchange
    memory_limit: int = 0
    peak_rss: int = 0
    workers: int = 1
    # what decided the picks, summed over the parts selected by this run (see SelectionReport)
    n_tie_picks: int = 0
    n_zero_gain_picks: int = 0
    n_duplicates_skipped: int = 0
    n_near_duplicates_removed: int = 0
    n_one_mode_pools: int = 0
    n_no_embedding: int = 0  # candidates with a null embedding (mrt embed --empty-text keep), left out
    # where the time went: wall and CPU seconds per step (mrt_fast.datasets.profile.Profile.to_dict)
    profile: dict = field(default_factory=dict)

    # the names of the first select report
    n_parts = property(lambda self: self.parts, lambda self, v: setattr(self, "parts", v))
    n_input_rows = property(lambda self: self.rows, lambda self, v: setattr(self, "rows", v))
    n_out_rows = property(lambda self: self.rows_out, lambda self, v: setattr(self, "rows_out", v))

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        return {**super().to_dict(), "n_parts": self.parts, "n_input_rows": self.rows, "n_out_rows": self.rows_out}

    def lines(self) -> list[tuple[str, str]]:
        """The summary as (label, value) rows: what `str(report)` and `mrt select` print."""
        if self.engine == "ray":  # parts: buckets exchanged through files, runs of pools read in place, or rows
            buckets = f"{self.parts}" + (" (exchanged through files)" if self.spilled else
                                         " (pools in consecutive rows, read in place)" if self.in_place
                                         else " (rows as read)")
            memory = f"{self.peak_rss / 2**30:.2f} GiB in this process (Ray's tasks: see its log)"
        else:
            buckets = f"{self.parts}" + (" (spilled to disk)" if self.spilled else
                                         " (pools in consecutive rows, read in place)" if self.in_place
                                         else " (in memory)")
            memory = f"{self.peak_rss / 2**30:.2f} GiB (limit {self.memory_limit / 2**30:.2f} GiB)"
        if self.resumed:
            buckets += f", {self.parts_done_now} done by this run"
        rows = [
            ("method", f"{self.method}, k = {self.k}"),
            ("pools", f"{self.n_pools:,} ({self.n_candidates:,} candidates, {self.n_kept:,} kept)"),
            ("pools <= K (kept whole)", f"{self.n_small_pools:,}"),
        ]
        if self.mean_ratio is not None:
            rows.append(("mean certified ratio", f"{self.mean_ratio:.4f}"))
            rows.append(("zero-gain picks", f"{self.n_zero_gain_picks:,}"))
        rows += pick_lines(self)
        rows += [("buckets", buckets), ("prompts/s" if self.layout == "grouped" else "rows/s",
                                        f"{self.rows_per_second:,.0f}"),
                 ("peak memory", memory), ("seconds", f"{self.seconds:.2f}")]
        return rows

    def profile_lines(self) -> list[tuple[str, str]]:
        """Where the time went (``mrt select --profile``): each step's wall and CPU seconds, then the
        pieces of the buckets' work summed over the buckets (:mod:`mrt_fast.datasets.profile`)."""
        steps, pieces = self.profile.get("steps", {}), self.profile.get("pieces", {})
        out = [(name, f"{s['wall']:.3f} s wall, {s['cpu']:.3f} s CPU") for name, s in steps.items()]
        out += [(f"  {name}", f"{p['wall']:.3f} s summed over {int(p['count']):,} {name.split()[0]}s")
                for name, p in pieces.items()]
        return out

    def __repr__(self) -> str:
        return (f"BatchReport(output={self.output!r}, method={self.method!r}, k={self.k!r}, n_pools={self.n_pools}, "
                f"n_kept={self.n_kept}, n_parts={self.parts}, n_tie_picks={self.n_tie_picks}, "
                f"n_zero_gain_picks={self.n_zero_gain_picks}, n_duplicates_skipped={self.n_duplicates_skipped}, "
                f"n_one_mode_pools={self.n_one_mode_pools}, seconds={self.seconds:.2f})")
