"""The controlled simulations: building blocks, and the quick run's qualitative shape."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.torch


@pytest.fixture(autouse=True)
def _threads():
    import torch

    torch.set_num_threads(1)


def test_decompose_recovers_components():
    from mrt_fast.simulate._estimate import _decompose

    rng = np.random.default_rng(0)
    v_x, v_y = 0.5, 2.0
    a = rng.normal(0, np.sqrt(v_x), size=(4000, 1)) + rng.normal(0, np.sqrt(v_y), size=(4000, 6))
    d = _decompose(a)
    assert d["v_x"] == pytest.approx(v_x, rel=0.1)
    assert d["v_y_given_x"] == pytest.approx(v_y, rel=0.05)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(2, 5), st.integers(0, 10_000))
def test_decompose_formula(p, k, seed):
    from mrt_fast.simulate._estimate import _decompose

    a = np.random.default_rng(seed).normal(size=(p, k)) * 3
    d = _decompose(a)
    s2 = a.var(1, ddof=1)
    assert d["v_y_given_x"] == pytest.approx(s2.mean())
    assert d["v_x"] == pytest.approx(max(0.0, a.mean(1).var(ddof=1) - (s2 / k).mean()))
    assert d["v_x"] >= 0


def test_decompose_bad_input():
    from mrt_fast.simulate._estimate import _decompose

    with pytest.raises(ValueError, match="2-D"):
        _decompose(np.zeros(5))
    with pytest.raises(ValueError, match="at least 2 responses"):
        _decompose(np.array([[1.0, np.nan], [1.0, 2.0]]))
    with pytest.raises(ValueError, match="inf"):
        _decompose(np.array([[1.0, np.inf], [1.0, 2.0]]))


def test_budget_cells_match_paper():
    from mrt_fast.simulate._mdn_experiments import budget_cells

    cells = budget_cells(400, 4, 1, (1, 2, 4, 6, 8, 12, 16))
    assert [n for _, n in cells] == [80, 66, 50, 40, 33, 25, 20]
    with pytest.raises(ValueError, match="K must be"):
        budget_cells(400, 4, 1, (0,))


def test_batched_training_equals_separate_training():
    """Models trained together follow exactly the trajectory they follow alone."""
    import torch

    from mrt_fast.simulate import _data as D
    from mrt_fast.simulate import _mdn as M

    g = D.generator(0)
    x = D.prompts((2, 12), g)
    y, _ = D.responses(x, 3, g)
    mask = torch.ones_like(y)
    mask[1, 6:, :] = 0  # the second model has fewer prompts
    both = M.init_params([1, 2])
    M.train(both, x, y, mask, epochs=15, clip=0.5)  # clip active: per-model clipping must hold too
    alone = M.init_params([2])
    M.train(alone, x[1:], y[1:], mask[1:], epochs=15, clip=0.5)
    for name in both:
        torch.testing.assert_close(both[name][1], alone[name][0], rtol=1e-4, atol=1e-5)


def test_gradient_factorisation_matches_direct_per_sample_grads():
    import torch

    from mrt_fast.simulate import _data as D
    from mrt_fast.simulate import _mdn as M
    from mrt_fast.simulate import _selectors as S

    p = M.init_params([5])
    g = D.generator(1)
    x = D.prompts((3,), g)
    y, _ = D.responses(x, 4, g)
    jac = S.head_jacobian(p, x)
    v = S.output_grads(p, x, y)
    direct = S.param_grads(p, x, y)
    assert direct.shape[-1] == M.n_params(p)
    torch.testing.assert_close(torch.einsum("nop,nro->nrp", jac, v), direct, rtol=1e-4, atol=1e-6)


def test_response_features_kernel():
    from mrt_fast.simulate._selectors import response_features

    e = response_features(np.array([0.0, 0.1, 1.5, -1.5]))
    e = e / np.linalg.norm(e, axis=1, keepdims=True)
    c = e @ e.T
    assert c[0, 1] > 0.9  # same mode
    assert c[0, 2] < 0.05 and c[0, 3] < 0.05  # neighbouring modes
    with pytest.raises(ValueError, match="finite"):
        response_features(np.array([np.nan]))


def test_selector_emse_one_select_call_per_selector(monkeypatch):
    """Each selector is one library call over all pools (no loop over pools)."""
    from mrt_fast.simulate import _selectors as S

    calls = []
    real = S._select

    def spy(df, k, method, **kw):
        calls.append((method, df["prompt_id"].n_unique()))
        return real(df, k, method, **kw)

    monkeypatch.setattr(S, "_select", spy)
    r = S.selector_emse(n_prompts=3, pools=5, target_responses=50)
    assert [m for m, _ in calls] == list(S.SELECTORS)
    assert all(n == 15 for _, n in calls)
    assert set(r["selectors"]) == set(S.SELECTORS)


def test_quick_run_shapes(tmp_path):
    from mrt_fast.simulate import run

    res = run(quick=True, out=tmp_path, seed=0, threads=1)
    # (a) variance decreasing to a floor, and close to the law
    v = res["variance_law"]
    meas = np.array(v["measured_variance"])
    assert meas[0] > 2.5 * meas[-1]
    assert meas[-1] > v["prompt_floor"] * 0.7
    assert np.all(np.abs(meas - v["predicted_variance"]) / v["predicted_variance"] < 0.45)
    # (b) U shape: interior mean below both ends
    b = np.array(res["cost_budget"]["test_nll_mean"])
    assert b[1:-1].min() < min(b[0], b[-1])
    # (c) top-K biased, pointing away from the target; stratified/diverse less variable than random
    s = res["selector_emse"]["selectors"]
    assert s["top"]["bias2"] > 5 * s["random"]["bias2"]
    assert s["top"]["cosine"] < 0.2 < s["random"]["cosine"]
    assert s["stratified"]["trace_cov"] < s["random"]["trace_cov"]
    assert s["diverse"]["trace_cov"] < s["random"]["trace_cov"]
    # (d) top-K concentrates on the reward mode as n grows
    rows = res["topk_pool_sweep"]["rows"]
    assert rows[-1]["top"]["reward_mode_fraction"] >= rows[0]["top"]["reward_mode_fraction"]
    assert rows[-1]["top"]["bias2"] > rows[0]["top"]["bias2"]
    # (e) top-K transformer stays worse than random at the largest K
    t = res["token_transformer"]["test_nll"]
    kmax = max(res["token_transformer"]["ks"])
    assert t["top"][kmax] > t["random"][kmax]
    # outputs
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["variance_law"]["ks"] == [1, 2, 4, 8, 16, 32]
    assert len(list(tmp_path.glob("*.png"))) == 6
    assert (tmp_path / "fig_f_per_prompt_k.png").exists()
    assert {"per_prompt_k", "interval_coverage"} <= set(saved)
    assert {r["quantity"] for r in res["comparison"]} >= {"(b) predicted K*"}


def test_run_rejects_bad_seed():
    from mrt_fast.simulate import run

    with pytest.raises(ValueError, match="seed"):
        run(quick=True, seed=-1)


def test_cli_prints_comparison(monkeypatch, tmp_path):
    """`mrt simulate` wires options to run() and prints every comparison row."""
    from typer.testing import CliRunner

    import mrt_fast.simulate as sim
    from mrt_fast.cli import app

    seen = {}

    def fake_run(quick, out, seed, threads, progress=None):
        seen.update(quick=quick, out=out, seed=seed, threads=threads)
        return {"total_seconds": 1.0, "comparison": [
            {"quantity": "(b) predicted K*", "paper": "5.3", "measured": "5.41", "agrees": True, "note": "n"},
            {"quantity": "(c) cos", "paper": "< 0", "measured": "0.2", "agrees": False, "note": "m"},
        ]}

    monkeypatch.setattr(sim, "run", fake_run)
    r = CliRunner().invoke(app, ["simulate", "--quick", "--out", str(tmp_path), "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert seen == {"quick": True, "out": tmp_path, "seed": 3, "threads": 2}
    assert "predicted K*" in r.output and "5.41" in r.output and "no" in r.output
