"""The package's layout holds: subpackages layered one way, no import cycles, no private
name crossing a subpackage, and every ``__all__`` serving exactly what it lists."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "python" / "mrt_fast"

# Lower layers never import upper ones; areas of one layer do not import each other.
LAYERS = {
    "errors": 0, "_grades_core": 0,
    "_util": 1,
    "tables": 2,
    "selection": 3,
    "variance": 4,
    "datasets": 5,
    "embeddings": 6, "sandbox": 6,
    "answers": 6.5,  # answer keys and checkers: runs programs in the sandbox, stages on the job
    "llm": 7, "simulate": 7,
    "cli": 8,
}
SUBPACKAGES = [a for a in LAYERS if (PKG / a).is_dir()]


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _imports(path: Path, text: str | None = None) -> list[tuple[str, list[str], int]]:
    """Every import of a module (top level, inside functions and under ``if TYPE_CHECKING``:
    a type named in an annotation is a dependency too): (module, names, line). ``text``
    stands for the file's contents when given."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    me = _module_name(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([base] if base else []))
            out.append((base, [a.name for a in node.names], node.lineno))
    return out


def _graph(texts: dict[str, str] | None = None):
    """Module -> the mrt_fast modules it imports (a `from pkg import mod` counts as mod).
    ``texts`` (module -> source) replaces the package's files when given."""
    if texts is None:
        mods = {_module_name(p): p for p in PKG.rglob("*.py")}
        mods["mrt_fast._grades_core"] = PKG / "_grades_core.pyi"  # the compiled core: imports nothing
    else:
        mods = {m: PKG.parent.joinpath(*m.split(".")).with_suffix(".py") for m in texts}
    edges = defaultdict(set)
    for name, path in mods.items():
        for target, names, line in _imports(path, None if texts is None else texts[name]):
            if not target.startswith("mrt_fast"):
                continue
            for n in names or [""]:
                full = f"{target}.{n}" if n else target
                dest = full if full in mods else target
                if dest in mods and dest != name:
                    edges[name].add((dest, n, line))
    return mods, edges


def _area(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _cycles(mods, edges):
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w, _, _ in edges.get(v, ()):
            # a package's __init__ re-exporting its modules is not a cycle of ideas
            if w == v.rsplit(".", 1)[0] and mods[w].name == "__init__.py":
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(mods):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    mods, edges = _graph()
    assert _cycles(mods, edges) == []


def test_cycle_finder_sees_a_cycle():
    mods = {"mrt_fast.a.x": Path("x.py"), "mrt_fast.a.y": Path("y.py")}
    edges = {"mrt_fast.a.x": {("mrt_fast.a.y", "", 1)}, "mrt_fast.a.y": {("mrt_fast.a.x", "", 1)}}
    assert _cycles(mods, edges) == [["mrt_fast.a.x", "mrt_fast.a.y"]]


def test_cycle_finder_sees_a_cycle_within_a_subpackage_through_type_only_imports():
    """Three modules of one area, one of them naming the first only in an annotation."""
    texts = {
        "mrt_fast.datasets.sources": "def read():\n    from mrt_fast.datasets.contiguous import read_contiguous\n",
        "mrt_fast.datasets.contiguous": "def read_contiguous():\n    from mrt_fast.datasets.arrow_runs import plan_runs\n",
        "mrt_fast.datasets.arrow_runs": ("from typing import TYPE_CHECKING\n"
                                         "if TYPE_CHECKING:\n    from mrt_fast.datasets.sources import Dataset\n"),
    }
    mods, edges = _graph(texts)
    assert _cycles(mods, edges) == [sorted(texts)]
    texts["mrt_fast.datasets.arrow_runs"] = texts["mrt_fast.datasets.arrow_runs"].replace("sources import Dataset",
                                                                                          "file_set import FileSet")
    mods, edges = _graph(texts)
    assert _cycles(mods, edges) == []


def test_layers_run_one_way():
    mods, edges = _graph()
    bad = []
    for src, dests in edges.items():
        a = _area(src)
        if a not in LAYERS:  # the top-level __init__ serves every area
            continue
        for dest, _, line in dests:
            b = _area(dest)
            if b is None or b == a or b not in LAYERS:
                continue
            if LAYERS[b] >= LAYERS[a]:
                bad.append(f"{mods[src].relative_to(PKG)}:{line} imports {dest} ({a} -> {b})")
    assert bad == []


def test_every_module_belongs_to_an_area():
    stray = [m for m in _graph()[0] if m.count(".") == 1 and _area(m) not in LAYERS
             and m not in ("mrt_fast.__init__",)]
    assert stray == []


def test_no_private_name_crosses_a_subpackage():
    mods, _ = _graph()
    bad = []
    for name, path in mods.items():
        for target, names, line in _imports(path):
            if not target.startswith("mrt_fast.") or _area(target) == _area(name):
                continue
            for n in names:
                if n.startswith("_") and not n.startswith("__") and n != "_grades_core":
                    bad.append(f"{path.relative_to(PKG)}:{line} takes {n} from {target}")
            leaf = target.rsplit(".", 1)[-1]
            if leaf.startswith("_") and leaf not in ("_grades_core", "_util") and _area(target) != "_util":
                bad.append(f"{path.relative_to(PKG)}:{line} imports private module {target}")
    assert bad == []


@pytest.mark.parametrize("area", ["mrt_fast"] + [f"mrt_fast.{a}" for a in SUBPACKAGES if a not in ("_util",)])
def test_all_lists_what_the_package_serves(area):
    mod = importlib.import_module(area)
    assert hasattr(mod, "__all__"), f"{area} has no __all__"
    missing = [n for n in mod.__all__ if not hasattr(mod, n)]
    assert missing == [], f"{area}.__all__ names what it does not serve: {missing}"
    assert len(set(mod.__all__)) == len(mod.__all__)


def test_top_level_dir_is_its_all_and_its_areas():
    import mrt_fast

    public = {n for n in dir(mrt_fast) if not n.startswith("_")}
    assert public == (set(mrt_fast.__all__) | set(mrt_fast.AREAS)) - {"__version__"}
    ns: dict = {}
    exec("from mrt_fast import *", ns)
    assert set(mrt_fast.__all__) <= set(ns)
    for area in mrt_fast.AREAS:
        assert getattr(mrt_fast, area) is importlib.import_module(f"mrt_fast.{area}")


def test_the_package_imports_no_heavy_stack():
    """`import mrt_fast` loads no area (and so no polars or NumPy) until one of its names is used."""
    import subprocess
    import sys

    code = ("import sys, mrt_fast; heavy = {'pandas', 'torch', 'ray', 'transformers', 'faiss', "
            "'sentence_transformers', 'matplotlib', 'polars', 'numpy', 'mrt_fast.selection'}; "
            "print(sorted(heavy & set(sys.modules)))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]", r.stdout


EXECUTORS = "mrt_fast.datasets.executors"


def _executor_of(module: str) -> str | None:
    """The executor a module of the executors' folder belongs to: its name up to the first ``_``
    (``local_plan`` is the local executor's, ``ray_tasks`` Ray's); None for modules elsewhere."""
    if not module.startswith(EXECUTORS + "."):
        return None
    return module[len(EXECUTORS) + 1:].split(".")[0].split("_")[0]


def _executors_reaching_another(edges) -> list[str]:
    """Every executor module from which a module of another executor is reached, directly or not."""
    bad = []
    for start in sorted({m for m in edges} | {d for ds in edges.values() for d, _, _ in ds}):
        own = _executor_of(start)
        if own is None:
            continue
        seen, todo = {start}, [start]
        while todo:
            for dest, _, _ in edges.get(todo.pop(), ()):
                if dest in seen:
                    continue
                seen.add(dest)
                other = _executor_of(dest)
                if other is not None and other != own:
                    bad.append(f"{start} reaches {dest}")
                todo.append(dest)
    return bad


def test_no_executor_imports_another():
    """The local and the Ray executor stand side by side: each imports the job, the stages and the
    exchange, never (even through another module) the other executor."""
    _, edges = _graph()
    assert _executors_reaching_another(edges) == []
    assert {_executor_of(m) for m in _graph()[0]} >= {"local", "ray"}


def test_executor_rule_sees_one_executor_reaching_another():
    x = EXECUTORS
    edges = {f"{x}.ray": {("mrt_fast.datasets.stage", "", 1)},
             "mrt_fast.datasets.stage": {(f"{x}.local_plan", "", 2)}}
    assert _executors_reaching_another(edges) == [f"{x}.ray reaches {x}.local_plan"]
