"""Checkpoints on object storage (S3, GCS, Azure Blob, memory) through fsspec.

The commit protocol for object stores (`preemptible.checkpoint.commit.ConditionalCommit`): every data object is
uploaded, then ``COMMIT.json`` is written last as one conditional PUT (``publish_new``: it fails if the object
exists), which appears atomically. There is no rename: a checkpoint without its marker does not exist, and leftovers
of failed uploads are ignored by restore and deleted by cleanup.

Uploads stream from tensor memory in parts (multipart uploads on S3; no whole-file copy); several files go up
at once. Transient errors (connection resets, 500, 503, throttling) are retried with exponential backoff by
`retrying`, within a time budget; an upload that finally fails is aborted (its multipart upload discarded), so
nothing half-written commits and the previous checkpoint stays usable.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import io
import logging
import re
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from preemptible.errors import StorageCredentialsError, StorageUnavailableError

log = logging.getLogger("preemptible")

EXTRAS = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("adlfs", "azure"),
    "abfs": ("adlfs", "azure"),
    "abfss": ("adlfs", "azure"),
}
PART_BYTES = 64 << 20
RETRY_BUDGET_S = 60.0

T = TypeVar("T")


def transient(error: BaseException) -> bool:
    """Errors worth another try: connection trouble, server errors, throttling."""
    if isinstance(error, (ConnectionError, TimeoutError)):
        return True
    if isinstance(error, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False  # answers, not faults: another try gets the same one
    text = f"{type(error).__name__} {error}".lower()
    # Status codes as words, not digits inside a name: "step-000000000500" is a path, not a 500.
    if re.search(r"(?<![\w./-])(500|502|503|504|429)(?![\w./-])", text):
        return True
    markers = (
        "slowdown",
        "slow down",
        "throttl",
        "internalerror",
        "serviceunavailable",
        "connection reset",
        "connection aborted",
        "remotedisconnected",
        "timed out",
        "requesttimeout",
        "too many requests",
        "broken pipe",
        "serverdisconnected",
        "clientconnectorerror",
    )
    return any(m in text for m in markers)


_CREDENTIAL_HINTS = {
    "botocore": "S3: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE, or the instance's or pod's role; "
    "or storage_options={'key': ..., 'secret': ...} (and 'client_kwargs': {'endpoint_url': ...} for another S3 "
    "service)",
    "google": "GCS: GOOGLE_APPLICATION_CREDENTIALS (a service account's key file), or `gcloud auth "
    "application-default login`, or the VM's service account; or storage_options={'token': ...}",
    "azure": "Azure Blob: AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
    "AZURE_STORAGE_ACCOUNT_KEY; or storage_options={'connection_string': ...} or {'account_name': ..., "
    "'account_key': ...}",
}


def credentials_error(error: BaseException, what: str) -> StorageCredentialsError | None:
    """The error to raise when ``error`` is an object store client finding no usable credentials (botocore's
    ``NoCredentialsError``, google-auth's ``DefaultCredentialsError``, Azure's ``ClientAuthenticationError``, ...),
    else None. Those are not ``OSError``s: left alone, they end a run with the client's traceback. One said already
    (an upload's, met again by the retry around it) is left as it is."""
    if isinstance(error, StorageCredentialsError):
        return None
    names = [c.__name__ for c in type(error).__mro__]
    if not any("Credential" in n or "Authentication" in n or n == "RefreshError" for n in names):
        return None
    client = type(error).__module__.split(".", 1)[0]
    hint = _CREDENTIAL_HINTS.get(client, "the credentials your object store's client reads")
    return StorageCredentialsError(
        f"{what} failed: the store's client has no usable credentials ({type(error).__name__}: {error}). Expected "
        f"credentials for {hint}. Set them and start again"
    )


def _raise_if_credentials(error: Exception, what: str) -> None:
    refused = credentials_error(error, what)
    if refused is not None:
        raise refused from error


def retrying(
    fn: Callable[[], T],
    *,
    what: str,
    budget_s: float = RETRY_BUDGET_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Call ``fn``; on a transient error wait (0.2 s, doubling, at most 5 s) and retry until ``budget_s``."""
    start = clock()
    delay = 0.2
    attempt = 1
    while True:
        try:
            return fn()
        except Exception as e:
            _raise_if_credentials(e, what)
            if not transient(e) or clock() - start + delay > budget_s:
                raise
            log.warning(
                "%s failed (%s: %s); retrying in %.1f s (attempt %d)", what, type(e).__name__, e, delay, attempt + 1
            )
            sleep(delay)
            delay = min(delay * 2, 5.0)
            attempt += 1


AZURE_FIRST_BACKOFF_S = 0.5


def quicken_azure_retries(fs: Any) -> bool:
    """Make the Azure SDK's own retries fit a notice window. True when it could.

    adlfs builds its clients with azure-storage-blob's default ``ExponentialRetry``: 15 s before the first retry,
    then 15 + 3^n. Inside Azure's ~30 s Preempt window one throttled request would eat half of it, and adlfs
    passes no retry settings through. Every client it makes (the file system's and each file's container client)
    shares the service client's policy objects, so tuning that one policy object covers them all.
    """
    pipeline = getattr(getattr(fs, "service_client", None), "_pipeline", None)
    tuned = False
    for policy in getattr(pipeline, "_impl_policies", None) or ():
        if hasattr(policy, "initial_backoff") and hasattr(policy, "increment_base"):
            policy.initial_backoff = AZURE_FIRST_BACKOFF_S  # then 0.5 + 2^n: 2.5, 4.5, ...
            policy.increment_base = 2
            policy.random_jitter_range = min(getattr(policy, "random_jitter_range", 0), AZURE_FIRST_BACKOFF_S)
            tuned = True
    if not tuned:
        log.debug("could not find the Azure SDK's retry policy to shorten; its defaults (15 s first back-off) apply")
    return tuned


class _ObjectWriter:
    """A streaming upload: parts go out as they fill; ``close`` completes it, ``abort`` discards it."""

    def __init__(self, fs: Any, path: str) -> None:
        self.path = path
        self._fs = fs
        self._f: Any = fs.open(path, "wb", block_size=PART_BYTES)

    def write(self, data: memoryview) -> None:
        try:
            self._f.write(data)
        except Exception as e:
            _raise_if_credentials(e, f"upload of {self.path}")
            raise

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except Exception as e:
                _raise_if_credentials(e, f"upload of {self.path}")
                raise

    def abort(self) -> None:
        f, self._f = self._f, None
        if f is None:
            return
        discard = getattr(f, "discard", None)  # s3fs: aborts the multipart upload
        try:
            if callable(discard):
                discard()
            else:
                f.close()
                self._fs.rm_file(self.path)
        except Exception as e:  # the failure that brought us here matters more
            log.warning("could not abort the upload of %s (%s); an incomplete upload may remain", self.path, e)


_PRECONDITION_FAILED = ("PreconditionFailed", "Precondition Failed", "412", "ConditionNotMet", "BlobAlreadyExists")


class FsspecStorage:
    """A prefix in an object store (or any fsspec file system), addressed by URL.

    Args:
        url: ``s3://bucket/prefix``, ``gs://...``, ``az://container/prefix``, ``memory://...``.
        storage_options: passed to the fsspec file system (credentials, ``client_kwargs={"endpoint_url": ...}``);
            the standard environment (``AWS_*``, ``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ...) is
            honoured by the backends themselves.
    """

    kind = "object"

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        try:
            import fsspec
        except ImportError as e:  # pragma: no cover - fsspec is a dependency of every extra
            raise StorageUnavailableError(
                f"checkpoint root {url!r} needs fsspec: pip install 'preemptible[s3]' (or gcs, azure)"
            ) from e
        protocol = url.split("://", 1)[0].lower()
        module, extra = EXTRAS.get(protocol, (None, None))
        if module is not None:
            try:
                importlib.import_module(module)
            except ImportError as e:
                raise StorageUnavailableError(
                    f"checkpoint root {url!r} uses {protocol}://, whose fsspec backend ({module}) is not installed; "
                    f"install it with: pip install 'preemptible[{extra}]'"
                ) from e
        self.url = url.rstrip("/")
        self.protocol = protocol
        # A file system of its own: fsspec's instance cache would hand back one made for another endpoint.
        self.fs: Any = fsspec.filesystem(protocol, skip_instance_cache=True, **(storage_options or {}))
        self.root = self.fs._strip_protocol(self.url)
        if module == "adlfs":
            quicken_azure_retries(self.fs)

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r})"

    def _retry(self, what: str, fn: Callable[[], T]) -> T:
        return retrying(fn, what=f"{self.protocol}: {what}")

    def join(self, *parts: str) -> str:
        return "/".join(p.strip("/") if i else p.rstrip("/") for i, p in enumerate(parts))

    def makedirs(self, path: str) -> None:
        if self.protocol == "memory":
            self.fs.makedirs(path, exist_ok=True)  # object stores have no directories to make

    def _fresh_ls(self, path: str, detail: bool) -> Any:
        # Every listing goes to the server: another process (the previous run, a peer rank) may have written.
        # Backends spell "no cache" differently (refresh=, invalidate_cache=); invalidate_cache() is common to all.
        self.fs.invalidate_cache(path)
        return self.fs.ls(path, detail=detail)

    def listdir(self, path: str) -> list[str]:
        try:
            entries = self._retry(f"list {path}", lambda: self._fresh_ls(path, detail=False))
        except FileNotFoundError:
            return []
        return sorted(str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries if str(e).rstrip("/") != path)

    def isdir(self, path: str) -> bool:
        return bool(self._retry(f"stat {path}", lambda: self.fs.isdir(path)))

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return bool(self._retry(f"stat {path}", lambda: self.fs.exists(path)))

    def size(self, path: str) -> int:
        self.fs.invalidate_cache(path)
        return int(self._retry(f"stat {path}", lambda: self.fs.size(path)))

    def newest_mtime(self, path: str) -> float | None:
        # Recursive: an attempt's files sit one prefix deeper (step-N/a-<token>/), and a prefix has no time of its own
        self.fs.invalidate_cache(path)
        try:
            found = self._retry(f"list {path}", lambda: self.fs.find(path, detail=True))
        except FileNotFoundError:
            return None
        infos = found.values() if isinstance(found, dict) else found
        newest = None
        for info in infos:
            keys = ("LastModified", "last_modified", "mtime", "updated", "created")  # s3fs, adlfs, local, gcsfs
            stamp = next((info[k] for k in keys if info.get(k)), None)
            if isinstance(stamp, str):
                stamp = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            value = stamp.timestamp() if isinstance(stamp, datetime) else (float(stamp) if stamp else None)
            if value is not None:
                newest = value if newest is None else max(newest, value)
        return newest

    def open_write(self, path: str) -> _ObjectWriter:
        return _ObjectWriter(self.fs, path)

    def open_read(self, path: str) -> Any:
        return self._retry(f"open {path}", lambda: self.fs.open(path, "rb", block_size=PART_BYTES, cache_type="none"))

    def read_range(self, path: str, offset: int, buffer: memoryview) -> int:
        end = offset + len(buffer)
        data = self._retry(
            f"get {path} bytes {offset}-{end - 1}", lambda: self.fs.cat_file(path, start=offset, end=end)
        )
        buffer[: len(data)] = data
        return len(data)

    def read_bytes(self, path: str, limit: int) -> bytes:
        data = self._retry(f"get {path}", lambda: self.fs.cat_file(path))
        if len(data) > limit:
            from preemptible.errors import FileTooLargeError

            raise FileTooLargeError(f"{path} is larger than the {limit} bytes expected of it")
        return bytes(data)

    def publish(self, path: str, data: bytes) -> None:
        # IMPORTANT: the commit point on object stores: one PUT of the whole marker, which becomes visible
        # atomically, after every data object is complete. Never a rename (copy + delete is not atomic).
        self._retry(f"put {path}", lambda: self.fs.pipe_file(path, data))
        self.fs.invalidate_cache(path)

    def publish_new(self, path: str, data: bytes) -> None:
        # The check narrows the race for backends (or emulators) without a conditional create; the create closes it
        # where there is one. Without one, two writers inside that gap both succeed: the later object wins, and
        # each refers to its own complete files, so the checkpoint is whole either way.
        if self.exists(path):
            raise FileExistsError(errno.EEXIST, "already exists", path)
        self.create_only(path, data)

    def create_only(self, path: str, data: bytes) -> None:
        """One PUT that fails with FileExistsError if the object exists, where the backend offers it: S3
        ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure ``If-None-Match: *`` (fsspec's ``mode="create"``)."""
        try:
            self._retry(f"put {path}", lambda: self.fs.pipe_file(path, data, mode="create"))
        except FileExistsError:
            raise
        except Exception as e:
            if any(s in f"{type(e).__name__} {e}" for s in _PRECONDITION_FAILED):
                raise FileExistsError(errno.EEXIST, f"already exists ({e})", path) from e
            raise
        finally:
            self.fs.invalidate_cache(path)

    def escapes(self, path: str) -> str | None:
        return None  # object stores have no links

    def commit_dir(self, src: str, dst: str) -> None:
        raise OSError(errno.ENOTSUP, "an object store cannot rename a prefix atomically; commit with publish_new", src)

    def append_text(self, path: str) -> Any:
        return _BufferedObjectText(self, path)

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._retry(f"delete {path}", lambda: self.fs.rm_file(path))
        self.fs.invalidate_cache(path)

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._retry(f"delete {path}", lambda: self.fs.rm(path, recursive=True))
        self.fs.invalidate_cache(path)

    def move(self, src: str, dst: str) -> None:
        self._retry(f"move {src}", lambda: self.fs.mv(src, dst, recursive=True))

    def sync_dir(self, path: str) -> None:
        pass  # nothing to flush: an object is durable once its PUT (or multipart completion) returned


class _BufferedObjectText:
    """The journal on an object store: events collect in memory and the whole object is rewritten on
    ``flush(force=True)`` (at each save and at exit), never one request per event."""

    def __init__(self, storage: FsspecStorage, path: str) -> None:
        self._storage = storage
        self._path = path
        self._buf = io.StringIO()
        self.object_store = True

    def write(self, text: str) -> None:
        self._buf.write(text)

    def flush(self, force: bool = False) -> None:
        if force:
            self._storage.publish(self._path, self._buf.getvalue().encode())

    def fileno(self) -> int:
        raise OSError("an object has no file descriptor")

    def close(self) -> None:
        self.flush(force=True)
