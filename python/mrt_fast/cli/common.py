"""The `mrt` Typer app and what every command group shares: one-line errors, input checks, the extras."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import typer

from mrt_fast._util.messages import rich_console
from mrt_fast.errors import MissingDependencyError

app = typer.Typer(
    name="mrt",
    help="Multi-response training: how many responses per prompt to keep, which ones, and training on them.",
    no_args_is_help=True,
    add_completion=False,
)
console = rich_console()
#: --allow-partial, on every command that reads a dataset
ALLOW_PARTIAL = typer.Option(False, "--allow-partial", help="Read an unfinished mrt output (its job stopped "
                             "before the end): only its finished parts, with a warning giving their count and "
                             "rows. Without it such an input is refused.")


@app.callback()
def _before_every_command() -> None:
    from mrt_fast.cli.quiet import quiet_libraries

    quiet_libraries()


@contextlib.contextmanager
def user_errors(resumable: bool = False):
    """A user's error (bad input, a missing install, a full disk: `mrt_fast.errors.USER_ERRORS`,
    or a file the system refuses, an ``OSError``) ends the command with one line on stderr and
    exit code 2; Ctrl-C with one line (saying that a rerun resumes, for a ``resumable`` command)
    and exit code 130; a partial read's warning is one ``warning:`` line on stderr. Any other
    exception is a bug: it keeps its traceback."""
    import warnings

    from mrt_fast.errors import USER_ERRORS, PartialOutputWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, PartialOutputWarning):
            typer.echo(f"warning: {message}", err=True)
        else:
            shown(message, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = show
            yield
    except (*USER_ERRORS, OSError) as e:
        msg = (str(e).strip().splitlines() or [type(e).__name__])[0]
        typer.echo(f"error: {msg}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo("interrupted" + ("; rerun the same command to resume" if resumable else ""), err=True)
        raise typer.Exit(130) from None


def warn_notes(notes: list[str]) -> None:
    """A run's notes (what it did beside its work, or could not do), one ``warning:`` line each on stderr."""
    for note in notes:
        typer.echo(f"warning: {note}", err=True)


def table(on=None, **kw):
    """A rich Table as every command prints one: boxed on a terminal; written to a pipe or a log,
    plain aligned columns (no box-drawing characters), so the output reads and greps as text.
    ``on``: the console it is printed on (default the commands' own)."""
    from rich.table import Table

    if not (on if on is not None else console).is_terminal:
        kw.setdefault("box", None)
    return Table(**kw)


def print_report(rep, title: str, wrote: str, lines: list[tuple[str, str]] | None = None) -> None:
    """A job's report (:class:`~mrt_fast.datasets.report.JobReport`), printed the one way every
    command prints it: one line when the run found nothing to do; else its table (``lines``, by
    default the report's) under ``title``, what this run did beside the job's total when it
    resumed one, Ray's log directory, and ``wrote`` (what is where)."""
    if rep.nothing_to_do:
        console.print(rep.complete_line(), soft_wrap=True, highlight=False)
        return
    tab = table(title=title, show_header=False)
    tab.add_column("")
    tab.add_column("", justify="right")
    for name, v in rep.lines() if lines is None else lines:
        tab.add_row(name, v)
    console.print(tab)
    if rep.resumed:  # the table counts this run's work; the job holds more
        console.print(rep.run_summary(), soft_wrap=True, highlight=False)
    if rep.logs:
        console.print(f"Ray's logs: {rep.logs}", soft_wrap=True, highlight=False)
    console.print(wrote + (" (resumed)" if rep.resumed else ""), soft_wrap=True, highlight=False)


def print_lines(title: str, lines: list[tuple[str, str]]) -> None:
    """(label, value) rows as a table under ``title``, the way reports print."""
    tab = table(title=title, show_header=False)
    tab.add_column("")
    tab.add_column("", justify="right")
    for name, v in lines:
        tab.add_row(name, v)
    console.print(tab)


def seconds_since_start() -> float | None:
    """Seconds since this process started (Linux: its start time in /proc); None where not known."""
    import os

    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime, in clock ticks since boot
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def k_or_column(k: str):
    """--k: an integer, or the name of a column with each pool's K."""
    try:
        return int(k)
    except ValueError:
        return k


def check_engine(engine: str, ray_address: Optional[str], local_only: dict | None = None,
                 ray_only: dict | None = None, parts: dict | None = None) -> None:
    """--engine local|ray, and the flags given that have no meaning on it, refused in one line
    (``local_only``/``ray_only``: flag -> value, None when not given; ``parts``: flags that
    both set the part count, of which one at most)."""
    from mrt_fast.errors import MrtInputError

    if engine not in ("local", "ray"):
        raise MrtInputError(f"--engine must be 'local' or 'ray', got {engine!r}")
    if ray_address is not None and engine != "ray":
        raise MrtInputError("--ray-address needs --engine ray")
    if engine == "ray":
        given = [f for f, v in (local_only or {}).items() if v is not None]
        if given:
            raise MrtInputError(f"{', '.join(given)} applies to --engine local only (Ray sizes its own workers "
                                "and memory); leave it out or use --engine local")
    else:
        given = [f for f, v in (ray_only or {}).items() if v is not None]
        if given:
            raise MrtInputError(f"{', '.join(given)} applies to --engine ray only")
    given = [f for f, v in (parts or {}).items() if v is not None]
    if len(given) > 1:
        raise MrtInputError(f"give {' or '.join(given)}, not both: each sets the number of parts")
    for f in given:
        if parts[f] < 1:
            raise MrtInputError(f"{f} must be >= 1, got {parts[f]}")
    if engine == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:
            raise MissingDependencyError("--engine ray needs Ray Data: pip install 'mrt_fast[ray]'")


def kv_options(pairs: list[str] | None) -> dict:
    """--set key=value pairs (values parsed as YAML scalars/lists)."""
    import yaml

    out = {}
    for item in pairs or []:
        if "=" not in item:
            raise typer.BadParameter(f"--set expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v)
    return out

def check_input_table(path: Path, columns: tuple[str, ...] = (), role: str = "input", *, dataset: bool = False,
                      allow_partial: bool = False):
    """Check an input table before any work: readable, the columns present, at least one row.
    ``dataset``: ``path`` may also be a directory (an ``mrt`` output included; an unfinished one
    only with ``allow_partial``) or a glob, found as every dataset job finds its input."""
    import polars as pl

    from mrt_fast.datasets import formats as _formats
    from mrt_fast.errors import MrtInputError

    if dataset:
        from mrt_fast.datasets.sources import discover

        lf = discover(str(path), allow_partial=allow_partial).scan()
    else:
        lf = _formats.scan(path)
    names = lf.collect_schema().names()
    missing = [c for c in columns if c not in names]
    if missing:
        raise MrtInputError(f"{role} {str(path)!r}: column(s) {missing} not found; it has columns {names}",
                            column=missing[0])
    if int(_formats.collect(lf.select(pl.len()), path).item()) == 0:
        raise MrtInputError(f"{role} {str(path)!r} has no rows")
    return lf


def check_text_columns(lf, path: Path, columns: tuple[str, ...]) -> None:
    """Text columns hold text (one string, or a list of strings in the grouped layout) and no null,
    checked before any model loads; the first null is named by its row."""
    import polars as pl

    from mrt_fast.errors import MrtInputError

    schema = lf.collect_schema()
    for c in columns:
        t = schema[c]
        if t != pl.Utf8 and not (isinstance(t, pl.List) and t.inner == pl.Utf8):
            raise MrtInputError(f"column {c!r} must hold text, got {t}", column=c)
    nulls = lf.select([pl.col(c).is_null().arg_max().alias(c) for c in columns]
                      + [pl.col(c).null_count().alias(f"__n_{c}") for c in columns]).collect()
    for c in columns:
        if nulls[f"__n_{c}"][0]:
            row = int(nulls[c][0])
            raise MrtInputError(f"{str(path)!r}: column {c!r} is null in row {row}", column=c, row=row)
    for c in columns:  # grouped: a null inside a list, named by its row and its index in the list
        if isinstance(schema[c], pl.List):
            inner = pl.col(c).list.eval(pl.element().is_null())
            got = lf.select(inner.list.any().arg_true().first().alias("row")).collect()["row"][0]
            if got is not None:
                cell = lf.slice(int(got), 1).select(c).collect()[c][0]
                cand = next(i for i, t in enumerate(cell) if t is None)
                raise MrtInputError(f"{str(path)!r}: column {c!r} is null at row {got}, candidate {cand}",
                                    column=c, row=int(got))


#: the response column's two usual names: one response a row (flat), a list a prompt (grouped, as vLLM's n)
RESPONSE_NAMES = ("response", "responses")
RESPONSE_HELP = ("Response text column (default: response, or responses when the input has that column and no "
                 "response column); --response-column is the same option in every command.")


def response_column(inp, given: Optional[str], flag: str = "--response-column", allow_partial: bool = False) -> str:
    """The response column of ``inp`` (a file, directory or glob): ``given`` when set (a missing one is
    refused, naming the other usual name when the input has it); else ``response``, or ``responses``
    when only that one is there (said on stderr)."""
    from mrt_fast.datasets.sources import discover
    from mrt_fast.errors import MrtInputError

    names = discover(str(inp), allow_partial=allow_partial).scan().collect_schema().names()
    if given is not None:
        if given in names:
            return given
        other = next((n for n in RESPONSE_NAMES if n != given and n in names), None) if given in RESPONSE_NAMES \
            else None
        hint = f"; did you mean {other!r}? (give {flag} {other})" if other else ""
        raise MrtInputError(f"column {given!r} ({flag}) not found in {str(inp)!r}; it has columns {names}{hint}",
                            column=given)
    if RESPONSE_NAMES[0] not in names and RESPONSE_NAMES[1] in names:
        typer.echo(f"note: reading the responses from column {RESPONSE_NAMES[1]!r} (there is no "
                   f"{RESPONSE_NAMES[0]!r} column; {flag} sets it)", err=True)
        return RESPONSE_NAMES[1]
    return RESPONSE_NAMES[0]


def check_job_output(out: Path | str) -> None:
    """Check a dataset job's output before any work (and before a model loads): a directory
    (an existing one, or a name without a table suffix) that can be made, or a table file.
    An ``s3://`` output is checked for its form only (its store is reached when the job starts)."""
    from mrt_fast._util.files import check_output_dir
    from mrt_fast.datasets import storage
    from mrt_fast.datasets.formats import check_output
    from mrt_fast.datasets.job import is_directory_output

    if storage.is_url(out):
        is_directory_output(str(out))
        return
    if is_directory_output(Path(out)):
        check_output_dir(out)
    else:
        check_output(out)


def needs(extra: str):
    """An ImportError of an optional stack becomes one line naming the extra."""

    @contextlib.contextmanager
    def guard():
        try:
            yield
        except ImportError as e:
            raise MissingDependencyError(f"this command needs the {extra} extra: pip install 'mrt_fast[{extra}]' ({e})") from None

    return guard()
