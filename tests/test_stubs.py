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
