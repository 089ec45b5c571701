"""The fixed budget of Stage B: B = N_p (C_p + K C_r) spent on N_p prompts of K responses each.

C_r = 1 (one response is the unit), C_p = the cost ratio C_p / C_r of the pre-registration. B is set from a
reference K and its number of prompts (`budget_for`), and each K trains on the most prompts the budget pays
for (`prompts_for`).
"""

from __future__ import annotations

#: C_r, the cost of one response (the unit of the budget)
COST_RESPONSE = 1


def _positive_int(value, what: str) -> int:
    from mrt_fast import MrtInputError

    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise MrtInputError(f"{what} must be a positive whole number, got {value!r}")
    return value


def budget_for(n_train: int, ref_k: int, cost_ratio: int) -> int:
    """The budget B = n_train (C_p + ref_k C_r) that lets K = ref_k keep ``n_train`` prompts."""
    n_train = _positive_int(n_train, "n_train")
    ref_k = _positive_int(ref_k, "ref_k")
    cost_ratio = _positive_int(cost_ratio, "cost_ratio (C_p / C_r)")
    return n_train * (cost_ratio + ref_k * COST_RESPONSE)


def prompts_for(budget: int, k: int, cost_ratio: int) -> int:
    """N_p(K) = floor(B / (C_p + K C_r)): the most prompts of K responses each the budget pays for (at least 1)."""
    from mrt_fast import MrtInputError

    budget = _positive_int(budget, "budget")
    k = _positive_int(k, "K")
    cost_ratio = _positive_int(cost_ratio, "cost_ratio (C_p / C_r)")
    n = budget // (cost_ratio + k * COST_RESPONSE)
    if n < 1:
        raise MrtInputError(f"budget {budget} pays for no prompt at K = {k} (one prompt costs "
                            f"C_p + K C_r = {cost_ratio + k * COST_RESPONSE})")
    return n
