"""One-line messages from exceptions, and the console the command line prints with."""

from __future__ import annotations



def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return msg[0] if msg else type(e).__name__


#: the line width of output that is not on a terminal (a pipe, a log): no line is folded
PIPED_WIDTH = 10_000


def rich_console(stderr: bool = False):
    """A rich Console that folds lines only on a terminal: written to a pipe or a log, each line
    (a path, a report's value, a row of a table) stays whole, without colours."""
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    return Console(stderr=stderr, soft_wrap=not tty, width=None if tty else PIPED_WIDTH)
