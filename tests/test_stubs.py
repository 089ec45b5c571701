"""The typed stubs list exactly what the extension exports, with its signatures."""

import ast
import inspect
from pathlib import Path

import mrt_fast
from mrt_fast import _grades_core as core

STUB = Path(mrt_fast.__file__).with_name("_grades_core.pyi")


def _stub_defs():
    tree = ast.parse(STUB.read_text())
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    return funcs, classes


def _stub_attrs():
    """Module attributes the stub declares (`NAME: type`), private ones aside."""
    tree = ast.parse(STUB.read_text())
    names = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def test_every_export_has_a_stub_and_no_stub_is_stale():
    funcs, classes = _stub_defs()
    exported = {n for n in dir(core) if not n.startswith("_")}
    stubbed = set(funcs) | (classes & exported) | _stub_attrs()
    assert exported == stubbed, (exported - stubbed, stubbed - exported)


def test_stub_parameters_match_the_extension():
    funcs, _ = _stub_defs()
    for name, node in funcs.items():
        real = inspect.signature(getattr(core, name))
        stub_params = [a.arg for a in node.args.posonlyargs + node.args.args + node.args.kwonlyargs]
        assert stub_params == list(real.parameters), name


_NO_DEFAULT = object()


def _stub_signatures():
    """name -> {parameter: stub default (or _NO_DEFAULT)} for the stub's functions and class constructors."""
    tree = ast.parse(STUB.read_text())
    out = {}
    nodes = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
    nodes += [(c.name, f) for c in tree.body if isinstance(c, ast.ClassDef)
              for f in c.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"]
    for name, node in nodes:
        a = node.args
        pos = a.posonlyargs + a.args
        pos_defaults = [_NO_DEFAULT] * (len(pos) - len(a.defaults)) + list(a.defaults)
        params = dict(zip((p.arg for p in pos), pos_defaults))
        params.update({p.arg: _NO_DEFAULT if d is None else d for p, d in zip(a.kwonlyargs, a.kw_defaults)})
        params.pop("self", None)
        out[name] = {p: d if d is _NO_DEFAULT else ast.literal_eval(d) for p, d in params.items()}
    return out


def _real_defaults(obj):
    return {n: _NO_DEFAULT if p.default is inspect.Parameter.empty else p.default
            for n, p in inspect.signature(obj).parameters.items()}


def test_stub_defaults_match_the_extension():
    for name, stub in _stub_signatures().items():
        assert stub == _real_defaults(getattr(core, name)), name


def test_policy_defaults_live_in_python_only():
    """The kernel, alpha and eps of selection have one default, in Python
    (mrt_fast.selection.options): the core takes them from every caller."""
    for name in ("fl_batch", "fl_on_demand", "similarity", "FlParams"):
        real = _real_defaults(getattr(core, name))
        for p in ("kernel", "alpha", "eps"):
            if p in real:
                assert real[p] is _NO_DEFAULT, (name, p, real[p])


def test_kmeans_defaults_of_the_core_are_those_of_the_mode_policy():
    from mrt_fast.selection import modes

    policy = _real_defaults(modes.kmeans)
    real = _real_defaults(core.kmeans_modes)
    for p in ("m_max", "min_silhouette", "max_iter"):
        assert real[p] == policy[p], p
