"""The `mrt` command."""

from mrt_fast.cli.app import app

__all__ = ["app"]
