"""The `mrt` command: one module per command group, registered on one Typer app.

``python -m mrt_fast.cli`` and the ``mrt`` script run it through ``mrt_fast.cli.process.main``, which starts and
ends the process; ``app`` itself can be called in any Python process (Typer's ``CliRunner``, a notebook).
"""

# the command groups register their commands on import, in the order `mrt --help` lists them
from mrt_fast.cli import demo_cmd  # noqa: F401, I001
from mrt_fast.cli import embed  # noqa: F401
from mrt_fast.cli import select  # noqa: F401
from mrt_fast.cli import variance  # noqa: F401
from mrt_fast.cli import llm  # noqa: F401
from mrt_fast.cli import plan  # noqa: F401
from mrt_fast.cli import answers  # noqa: F401
from mrt_fast.cli import simulate  # noqa: F401
from mrt_fast.cli.common import app

__all__ = ["app"]
