"""`VarianceOptions`: every knob of the variance report, checked once.

`mrt_fast.variance_budget` takes them as keywords and builds one
`VarianceOptions`; the report builder, the streamed and the Ray paths receive
that object. `report_from_accumulator` and `VarianceAccumulator.report` take
either the object or the keywords. A bad value is one `MrtInputError` line
naming the knob.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mrt_fast.errors import MrtInputError
from mrt_fast.variance.bootstrap import bootstrap_method, interval_method
from mrt_fast.variance.law import check_costs

#: the K values of the predicted-variance table unless ``k_grid`` is given
DEFAULT_K_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)


def int_arg(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    """An integer argument in [lo, hi] (bools and floats refused)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi is not None and value > hi):
        raise MrtInputError(f"{name} must be an integer in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}")
    return int(value)


def _real(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


@dataclass(frozen=True)
class VarianceOptions:
    """The knobs of the variance report (see `mrt_fast.variance_budget` for each).

    After construction ``cost_prompt``, ``cost_response``, ``delta``,
    ``ci_level``, ``budget`` and ``loss_bound`` are floats (or None), the
    integers are ints and ``k_grid`` is a sorted tuple of distinct integers >= 1.
    """

    cost_prompt: float = 1.0
    cost_response: float = 1.0
    k_grid: Sequence[int] = DEFAULT_K_GRID
    k_max: int = 1024
    budget: float | None = None
    n_prompts: int | None = None
    delta: float = 0.05
    loss_bound: float | None = None
    n_boot: int = 1000
    seed: int = 0
    ci_level: float = 0.95
    bootstrap: str = "auto"
    interval: str = "auto"

    def __post_init__(self) -> None:
        cp, cr = check_costs(self.cost_prompt, self.cost_response)
        k_max = int_arg(self.k_max, "k_max", 1)
        k_grid = self.k_grid
        if not isinstance(k_grid, (Sequence, np.ndarray)) or isinstance(k_grid, str):
            raise MrtInputError(f"k_grid must be a sequence of integers >= 1, got {k_grid!r}")
        grid = tuple(sorted({int_arg(k, "every k_grid entry", 1, 2**62) for k in k_grid}))
        if not grid:
            raise MrtInputError(f"k_grid must hold integers >= 1, got {list(k_grid)}")
        if not _real(self.delta) or not 0 < self.delta < 1:
            raise MrtInputError(f"delta must be in (0, 1), got {self.delta}")
        if not _real(self.ci_level) or not 0 < self.ci_level < 1:
            raise MrtInputError(f"ci_level must be in (0, 1), got {self.ci_level}")
        n_boot = int_arg(self.n_boot, "n_boot", 0, 2**31 - 1)
        seed = int_arg(self.seed, "seed", 0)
        bootstrap_method(self.bootstrap, 0, 0)
        interval_method(self.interval)
        budget, loss_bound = self.budget, self.loss_bound
        if budget is not None and (not _real(budget) or not math.isfinite(budget) or budget <= 0):
            raise MrtInputError(f"budget must be a positive finite number, got {budget!r}")
        if loss_bound is not None and (not _real(loss_bound) or not math.isfinite(loss_bound) or loss_bound < 0):
            raise MrtInputError(f"loss_bound must be a finite number >= 0, got {loss_bound!r}")
        n_prompts = None if self.n_prompts is None else int_arg(self.n_prompts, "n_prompts", 1)
        for name, value in (("cost_prompt", cp), ("cost_response", cr), ("k_grid", grid), ("k_max", k_max),
                            ("budget", None if budget is None else float(budget)), ("n_prompts", n_prompts),
                            ("delta", float(self.delta)),
                            ("loss_bound", None if loss_bound is None else float(loss_bound)),
                            ("n_boot", n_boot), ("seed", seed), ("ci_level", float(self.ci_level))):
            object.__setattr__(self, name, value)

    @classmethod
    def of(cls, options: "VarianceOptions | None" = None, **keywords: Any) -> "VarianceOptions":
        """The options of a call: ``options`` as given, or built from the keywords
        (an unknown keyword, or both, is one `MrtInputError` line)."""
        if options is not None:
            if not isinstance(options, VarianceOptions):
                raise MrtInputError(f"options must be a VarianceOptions, got {type(options).__name__}")
            if keywords:
                raise MrtInputError(f"give either options=VarianceOptions(...) or the keywords {sorted(keywords)}, "
                                    "not both")
            return options
        unknown = sorted(set(keywords) - set(cls.__dataclass_fields__))
        if unknown:
            raise MrtInputError(f"unknown variance option(s) {unknown}; the options are "
                                f"{sorted(cls.__dataclass_fields__)}")
        return cls(**keywords)

    def replace(self, **changes: Any) -> "VarianceOptions":
        return dataclasses.replace(self, **changes)

    def keywords(self) -> dict[str, Any]:
        """The options as the keywords of `variance_budget` (``k_grid`` a list)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["k_grid"] = list(self.k_grid)
        return d
