"""Running untrusted generated programs in isolation (bubblewrap, seccomp, memory cgroups)."""

from __future__ import annotations

from mrt_fast.sandbox.run import (
    ISOLATIONS,
    STATUSES,
    ExecResult,
    bwrap_problem,
    extract_code,
    outputs_match,
    passes_tests,
    require_isolation,
    resolve_isolation,
    run_program,
)

__all__ = ["ISOLATIONS", "STATUSES", "ExecResult", "bwrap_problem", "extract_code", "outputs_match", "passes_tests",
           "require_isolation", "resolve_isolation", "run_program"]
