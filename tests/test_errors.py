"""Every exception class lives in `mrt_fast.errors`; a machine out of room is a resource error."""

from __future__ import annotations

import ast
import errno
import pickle
from pathlib import Path

import pytest

import mrt_fast.errors as errors
from mrt_fast.errors import MrtInputError, MrtResourceError

PKG = Path(__file__).resolve().parent.parent / "python" / "mrt_fast"


def _exception_classes(path: Path) -> list[str]:
    """Classes defined in a module that derive from an exception (by their bases' names)."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [ast.unparse(b) for b in node.bases]
            if any(b.endswith(("Error", "Exception", "Warning", "Fault")) or b in ("Exception", "BaseException")
                   for b in bases):
                out.append(node.name)
    return out


def test_every_exception_class_is_in_errors():
    """Outside `mrt_fast.errors` only a module's private control-flow signal may define one."""
    stray = {str(p.relative_to(PKG)): names for p in PKG.rglob("*.py") if p.name != "errors.py"
             for names in [[n for n in _exception_classes(p) if not n.startswith("_")]] if names}
    assert stray == {}


def test_the_classes_are_served_where_they_were():
    from mrt_fast.datasets import contiguous, job, ray_engine

    assert contiguous.Irregular is errors.Irregular
    assert job.StoppedForTest is errors.StoppedForTest
    assert ray_engine.TransientTaskError is errors.TransientTaskError
    assert ray_engine.InjectedFault is errors.InjectedFault
    assert issubclass(errors.InjectedFault, errors.TransientTaskError)


def test_a_resource_error_is_neither_bad_input_nor_a_value_error():
    e = MrtResourceError("no space left on device while writing 'x'", path="x")
    assert not isinstance(e, (ValueError, MrtInputError))
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is MrtResourceError and str(back) == str(e) and back.path == "x"
    assert MrtResourceError in errors.USER_ERRORS and MrtInputError in errors.USER_ERRORS


@pytest.mark.parametrize("raised", [OSError(errno.ENOSPC, "No space left on device"),
                                    OSError(errno.EDQUOT, "Disk quota exceeded"),
                                    RuntimeError("ComputeError: failed to write: No space left on device (os error 28)")])
def test_a_full_disk_is_a_resource_error(tmp_path, raised):
    from mrt_fast._util.disk_space import reporting_full_disk

    with pytest.raises(MrtResourceError, match=r"^no space left on device while writing to '.*out'.*bytes free") as e:
        with reporting_full_disk("writing to", tmp_path / "out"):
            raise raised
    assert not isinstance(e.value, ValueError) and e.value.path == str(tmp_path / "out")
    # one already said passes unchanged
    with pytest.raises(MrtResourceError) as again:
        with reporting_full_disk("writing elsewhere", tmp_path / "other"):
            raise e.value
    assert again.value is e.value


def _ray_errors():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    return [ray_exceptions.ObjectLostError("ab" * 14, b"", ""), ray_exceptions.OwnerDiedError("ab" * 14, b"", ""),
            ray_exceptions.ObjectStoreFullError("object store full"), ray_exceptions.OutOfDiskError("no disk"),
            ray_exceptions.OutOfMemoryError("killed")]


def test_a_lost_object_store_is_a_resource_error():
    from mrt_fast._util.object_store import object_store_error

    for e in _ray_errors():
        got = object_store_error(e)
        assert isinstance(got, MrtResourceError) and "\n" not in str(got), (type(e), got)
        assert type(e).__name__ in str(got) or "ObjectLostError" in str(got)
        try:  # found as the cause of another error too
            raise RuntimeError("task failed") from e
        except RuntimeError as wrapped:
            assert isinstance(object_store_error(wrapped), MrtResourceError)
    assert object_store_error(ValueError("bad")) is None
    assert object_store_error(MemoryError()) is None


def test_the_ray_engine_says_a_lost_object_in_one_line():
    pytest.importorskip("ray")
    from mrt_fast.datasets.executors.ray_runtime import Unwrapping as _Unwrapping

    for e in _ray_errors():
        with pytest.raises(MrtResourceError):
            with _Unwrapping():
                raise e
    with pytest.raises(ZeroDivisionError):  # anything else passes unchanged
        with _Unwrapping():
            raise ZeroDivisionError()
