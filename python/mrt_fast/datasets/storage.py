"""Object storage: ``s3://`` inputs and outputs through one filesystem.

Every object read, written, listed or deleted by a job goes through a
``pyarrow.fs.S3FileSystem`` (the filesystem Ray Data uses too), configured
from the usual environment variables: ``AWS_ENDPOINT_URL`` (or
``AWS_ENDPOINT_URL_S3``; an S3-compatible server such as MinIO or Ceph),
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (``AWS_SESSION_TOKEN``),
and ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``); without keys, the AWS SDK's
default chain (profile, instance role). polars reads the same variables
itself when it scans ``s3://`` files.

An object appears whole or not at all (one PUT; from 10 MiB on, pyarrow's
fixed threshold, a multipart upload, seen only once completed), so a job
never renames on object storage: it writes under a new name and records
the name last (:mod:`mrt_fast.datasets.object_output`). The one conditional
write the lock needs (create only if absent, replace only if unchanged) is
not in pyarrow; it is made with boto3 (:func:`put_if`), as is the abort of
the unfinished multipart uploads a killed writer leaves (:func:`abort_uploads`).

:class:`ObjectPath` is an object's URL with the few ``pathlib`` methods the
dataset code uses (name, suffix, parts, ``relative_to``, ``stat``), so a
:class:`mrt_fast.datasets.sources.Dataset` of objects reads like one of files.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import PurePosixPath
from typing import Any

from mrt_fast._util.messages import one_line
from mrt_fast.errors import MrtInputError

__all__ = ["ObjectPath", "abort_uploads", "delete", "delete_if", "filesystem", "get", "is_url", "join", "list_files",
           "open_input", "open_stream", "put", "put_if", "read_bytes", "write_bytes"]

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
#: the schemes an input or output may have besides a local path
SCHEMES = ("s3",)


def is_url(x: Any) -> bool:
    """Whether ``x`` names an object (``s3://bucket/key``) rather than a local path; another
    scheme is refused in one line."""
    if isinstance(x, ObjectPath):
        return True
    if not isinstance(x, str):
        return False
    m = _URL.match(x)
    if m is None:
        return False
    if m.group(1).lower() not in SCHEMES:
        raise MrtInputError(f"{x!r}: unsupported URL scheme {m.group(1)!r} (use a local path or s3://bucket/key)")
    if m.group(1) != m.group(1).lower():
        raise MrtInputError(f"{x!r}: write the scheme in lower case ({m.group(1).lower()}://bucket/key)")
    segments = x[m.end():].rstrip("/").split("/")
    if not segments[0]:
        raise MrtInputError(f"{x!r} names no bucket (use s3://bucket/key)")
    odd = next((p for p in segments if p in ("", ".", "..")), None)
    if odd is not None:
        said = "an empty segment ('//')" if not odd else f"a {odd!r} segment"
        raise MrtInputError(f"{x!r}: an object key with {said} names no one object the same way everywhere; "
                            "write the key without it")
    return True


def _key(url: str | "ObjectPath") -> str:
    """``bucket/key`` of a URL (what the filesystem takes), without a trailing slash."""
    return str(url).split("://", 1)[1].rstrip("/")


def join(url: str | "ObjectPath", *names: str) -> str:
    """The URL of ``names`` under ``url`` (a "directory" is a key prefix)."""
    return "/".join([str(url).rstrip("/"), *names])


def _env(*names: str) -> str | None:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return None


def _settings() -> tuple:
    return (_env("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"), _env("AWS_REGION", "AWS_DEFAULT_REGION"),
            _env("AWS_ACCESS_KEY_ID"), _env("AWS_SECRET_ACCESS_KEY"), _env("AWS_SESSION_TOKEN"))


def filesystem():
    """The ``pyarrow.fs.S3FileSystem`` of the environment's settings (see the module doc)."""
    return _filesystem(_settings())


@functools.lru_cache(maxsize=4)
def _filesystem(settings: tuple):
    import pyarrow.fs as pafs

    endpoint, region, key, secret, token = settings
    kw: dict[str, Any] = {"allow_delayed_open": True}  # a small object is one PUT (no multipart upload)
    if endpoint:
        scheme, _, host = endpoint.partition("://")
        kw.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
    if region:
        kw["region"] = region
    if key and secret:
        kw.update(access_key=key, secret_key=secret, session_token=token)
    return pafs.S3FileSystem(**kw)


def _failed(what: str, url: Any, e: BaseException) -> MrtInputError:
    return MrtInputError(f"cannot {what} {str(url)!r}: {one_line(e)}")


class ObjectPath:
    """An object's URL, with the ``pathlib`` methods the dataset code uses; ``size`` and
    ``mtime_ns`` come from the listing that found it (no request per object)."""

    def __init__(self, url: str, size: int | None = None, mtime_ns: int | None = None):
        self.url = str(url).rstrip("/")
        self._size, self._mtime = size, mtime_ns

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"ObjectPath({self.url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectPath) and other.url == self.url

    def __lt__(self, other: "ObjectPath") -> bool:
        return self.url < other.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __truediv__(self, name: str) -> "ObjectPath":
        return ObjectPath(join(self.url, name))

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.name).suffix

    @property
    def parts(self) -> tuple[str, ...]:
        return PurePosixPath(_key(self.url)).parts

    def relative_to(self, root: "ObjectPath | str") -> PurePosixPath:
        return PurePosixPath(_key(self.url)).relative_to(_key(root))

    def resolve(self) -> "ObjectPath":
        return self

    def is_symlink(self) -> bool:
        return False

    def is_file(self) -> bool:
        return self._stat()[0] is not None

    def exists(self) -> bool:
        return self.is_file()

    def stat(self) -> os.stat_result:
        size, mtime = self._stat()
        if size is None:
            raise MrtInputError(f"object {self.url!r} does not exist")
        return os.stat_result((0o100644, 0, 0, 1, 0, 0, size, mtime // 10**9, mtime // 10**9, mtime // 10**9,
                               mtime // 10**9, mtime // 10**9, mtime, mtime, mtime))

    def _stat(self) -> tuple[int | None, int]:
        if self._size is None:
            info = _info(self.url)
            if info is not None:
                self._size, self._mtime = info
        return self._size, self._mtime or 0


def _info(url: str) -> tuple[int, int] | None:
    """(size, mtime_ns) of an object, or None when there is none."""
    import pyarrow.fs as pafs

    try:
        fi = filesystem().get_file_info(_key(url))
    except Exception as e:  # noqa: BLE001 - the SDK's words, on one line
        raise _failed("read", url, e) from None
    if fi.type != pafs.FileType.File:
        return None
    return int(fi.size or 0), int(fi.mtime_ns or 0)


def list_files(url: str | ObjectPath, *, recursive: bool = True) -> list[ObjectPath]:
    """Every object under the prefix ``url/`` (``recursive``: in its "folders" too), sorted;
    none when there is none."""
    import pyarrow.fs as pafs

    try:
        infos = filesystem().get_file_info(pafs.FileSelector(_key(url), recursive=recursive, allow_not_found=True))
    except Exception as e:  # noqa: BLE001
        raise _failed("list", url, e) from None
    scheme = str(url).split("://", 1)[0]
    return sorted(ObjectPath(f"{scheme}://{fi.path}", int(fi.size or 0), int(fi.mtime_ns or 0))
                  for fi in infos if fi.type == pafs.FileType.File)


def read_bytes(url: str | ObjectPath) -> bytes | None:
    """An object's bytes as stored (a ``.gz`` object's compressed bytes), or None when it does not exist."""
    if _info(str(url)) is None:
        return None
    try:
        with filesystem().open_input_stream(_key(url), compression=None) as f:
            return f.read()
    except FileNotFoundError:
        return None
    except Exception as e:  # noqa: BLE001
        raise _failed("read", url, e) from None


def open_input(f: Any) -> Any:
    """What pyarrow reads ``f`` from: the path itself, or the object opened for random access."""
    if not is_url(f):
        return f
    try:
        return filesystem().open_input_file(_key(f))
    except Exception as e:  # noqa: BLE001
        raise _failed("read", f, e) from None


def open_stream(url: str | ObjectPath) -> Any:
    """An object opened for reading front to back, decompressed by its suffix (``.gz``, ``.zst``)."""
    try:
        return filesystem().open_input_stream(_key(url), compression="detect")
    except Exception as e:  # noqa: BLE001
        raise _failed("read", url, e) from None


def write_bytes(url: str | ObjectPath, data: bytes) -> None:
    """Write an object whole (it appears complete or not at all), its bytes as given: a key ending
    in ``.gz`` or ``.zst`` is not compressed again."""
    try:
        with filesystem().open_output_stream(_key(url), compression=None) as out:
            out.write(data)
    except Exception as e:  # noqa: BLE001
        raise _failed("write", url, e) from None


def put(local: str | os.PathLike, url: str | ObjectPath) -> None:
    """Upload a local file as the object ``url``."""
    import pyarrow.fs as pafs

    try:
        pafs.copy_files(os.fspath(local), _key(url), source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=filesystem())
    except Exception as e:  # noqa: BLE001
        raise _failed("write", url, e) from None


def delete(urls: list[str] | list[ObjectPath]) -> None:
    """Delete objects (one already gone is no error). One request per 1000 keys of a bucket, with
    boto3: pyarrow's delete would leave an empty "folder" marker object (``key/``) behind each
    prefix it empties."""
    by_bucket: dict[str, list[str]] = {}
    for u in urls:
        bucket, key = _bucket_key(str(u))
        by_bucket.setdefault(bucket, []).append(key)
    if not by_bucket:
        return
    c = _client()
    for bucket, keys in by_bucket.items():
        for i in range(0, len(keys), 1000):
            batch = keys[i:i + 1000]
            try:
                r = c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            except Exception as e:  # noqa: BLE001
                raise _failed("delete", f"s3://{bucket}/{batch[0]}", e) from None
            errs = [e for e in r.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errs:
                raise MrtInputError(f"cannot delete 's3://{bucket}/{errs[0].get('Key')}': {errs[0].get('Message')}")


# --------------------------------------------------------------------------- conditional writes


def _client():
    try:
        import boto3
    except ImportError:
        raise MrtInputError("an s3:// output needs boto3 for its lock (pip install boto3)") from None
    endpoint, region, key, secret, token = _settings()
    return boto3.client("s3", endpoint_url=endpoint, region_name=region or "us-east-1", aws_access_key_id=key,
                        aws_secret_access_key=secret, aws_session_token=token)


def _bucket_key(url: str) -> tuple[str, str]:
    bucket, _, key = _key(url).partition("/")
    return bucket, key


def put_if(url: str, data: bytes, *, etag: str | None = None) -> str | None:
    """Write ``url`` only if it does not exist (``etag`` None) or still has ``etag``: one
    conditional PUT (``If-None-Match: *`` / ``If-Match``). The new ETag, or None when the
    condition failed (another writer was first)."""
    c = _client()
    bucket, key = _bucket_key(url)
    cond = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
    try:
        return c.put_object(Bucket=bucket, Key=key, Body=data, **cond)["ETag"]
    except c.exceptions.ClientError as e:
        code = str(e.response.get("Error", {}).get("Code"))
        if code in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
            return None
        raise _failed("write", url, e) from None
    except Exception as e:  # noqa: BLE001
        raise _failed("write", url, e) from None


def get(url: str) -> tuple[bytes, str] | None:
    """An object's bytes and ETag (what :func:`put_if` compares), or None when it does not exist."""
    c = _client()
    bucket, key = _bucket_key(url)
    try:
        r = c.get_object(Bucket=bucket, Key=key)
        return r["Body"].read(), r["ETag"]
    except c.exceptions.NoSuchKey:
        return None
    except Exception as e:  # noqa: BLE001
        raise _failed("read", url, e) from None


def delete_if(url: str, etag: str) -> bool:
    """Delete ``url`` only if it still has ``etag`` (``If-Match``); whether it was deleted."""
    c = _client()
    bucket, key = _bucket_key(url)
    try:
        c.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
        return True
    except c.exceptions.ClientError as e:
        if str(e.response.get("Error", {}).get("Code")) in ("PreconditionFailed", "NoSuchKey", "412", "404"):
            return False
        raise _failed("delete", url, e) from None


# --------------------------------------------------------------------------- unfinished uploads


def abort_uploads(url: str, *, directory: bool) -> tuple[int, int]:
    """Abort the unfinished multipart uploads of an output: every one under the prefix ``url/``
    (``directory``) or of the key ``url`` itself (a file output), never one of a sibling such as
    ``url2/``. Returns (uploads aborted, bytes of their uploaded pieces); one already gone is not
    counted. An error of the store (one that does not list uploads: ``NotImplemented``) is an
    `MrtInputError` naming the prefix."""
    c = _client()
    bucket, key = _bucket_key(url)
    prefix = f"{key}/" if directory and key else key
    where = f"s3://{bucket}/{prefix}"
    try:
        pages = c.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix)
        uploads = [(u["Key"], u["UploadId"]) for page in pages for u in page.get("Uploads", [])
                   if u["Key"].startswith(prefix) and (directory or u["Key"] == key)]
    except Exception as e:  # noqa: BLE001
        raise _failed("list the unfinished uploads under", where, e) from None
    n = size = 0
    for k, upload in uploads:
        got = _uploaded_bytes(c, bucket, k, upload)
        try:
            c.abort_multipart_upload(Bucket=bucket, Key=k, UploadId=upload)
        except c.exceptions.NoSuchUpload:
            continue  # completed or aborted meanwhile
        except Exception as e:  # noqa: BLE001
            raise _failed("abort the unfinished upload of", f"s3://{bucket}/{k}", e) from None
        n, size = n + 1, size + got
    return n, size


def _uploaded_bytes(c: Any, bucket: str, key: str, upload: str) -> int:
    """Bytes of the pieces an unfinished upload holds (0 when the store does not say)."""
    try:
        pages = c.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload)
        return sum(int(p.get("Size", 0)) for page in pages for p in page.get("Parts", []))
    except Exception:  # noqa: BLE001 - the size is only reported
        return 0
