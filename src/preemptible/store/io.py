"""The one I/O layer under the store: local disk, and object stores through fsspec behind the same `Storage`.

It gives the primitives a commit is made of (``publish``: a temp name, fsync, rename and fsync of the directory on a
local file system; ``publish_new``: a write that fails if the object exists, on an object store); which protocol a
save commits with is chosen once, by `Storage.kind`, in `preemptible.checkpoint.commit.protocol_for`. Everything above
this module speaks only `Storage`.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
from typing import Any, Protocol

from preemptible.errors import FileTooLargeError, NotRegularFileError, OutsideRootError
from preemptible.store import direct, roots


class WriteStream(Protocol):
    def write(self, data: memoryview) -> None: ...

    def close(self) -> None:
        """Make the data durable (fsync on local disk, complete the upload on object stores)."""

    def abort(self) -> None:
        """Give up: release resources, leave no complete-looking object."""


class ReadStream(Protocol):
    def readinto(self, buffer: memoryview) -> int: ...

    def close(self) -> None: ...


class Storage(Protocol):
    """What the checkpoint store needs from a place to keep files."""

    root: str
    kind: str  # "local" or "object"

    def join(self, *parts: str) -> str: ...
    def makedirs(self, path: str) -> None: ...
    def listdir(self, path: str) -> list[str]: ...
    def isdir(self, path: str) -> bool: ...
    def exists(self, path: str) -> bool: ...
    def size(self, path: str) -> int: ...
    def newest_mtime(self, path: str) -> float | None: ...
    def open_write(self, path: str) -> WriteStream: ...
    def open_read(self, path: str) -> ReadStream: ...
    def read_bytes(self, path: str, limit: int) -> bytes: ...
    def read_range(self, path: str, offset: int, buffer: memoryview) -> int:
        """Read bytes ``[offset, offset + len(buffer))`` of ``path`` into ``buffer`` (one ranged request on an object
        store). Returns how many were read: fewer only where the file ends."""

    def publish(self, path: str, data: bytes) -> None: ...
    def publish_new(self, path: str, data: bytes) -> None:
        """`publish`, only if nothing is at ``path`` yet. Raises FileExistsError if something is."""

    def commit_dir(self, src: str, dst: str) -> None:
        """Rename the directory ``src`` to ``dst``, only if ``dst`` does not exist. Raises FileExistsError if it
        does. Local file systems only."""

    def append_text(self, path: str) -> Any: ...
    def remove(self, path: str) -> None: ...
    def move(self, src: str, dst: str) -> None: ...
    def remove_tree(self, path: str) -> None: ...
    def sync_dir(self, path: str) -> None: ...
    def escapes(self, path: str) -> str | None:
        """Where ``path`` leads when a symbolic link takes it anywhere but to itself, else None."""


def _open_regular(path: str, root: str | None = None) -> io.FileIO:
    """Open ``path`` for reading only if it is a regular file (a FIFO would block forever, a device never end)
    inside ``root``.

    Raises:
        NotRegularFileError: it is a directory, FIFO, device or socket (checked on the opened file: no race).
        OutsideRootError: the file opened is outside ``root`` (checked on the opened file where /proc says).
    """
    if root is not None:  # before the open: nothing outside the root is opened at all (a device, a FIFO, a secret)
        _check_inside(path, os.path.realpath(path), root)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if root is not None:  # and after it, on the file opened: a link swapped in between is caught too
            try:
                opened = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                opened = os.path.realpath(path)
            _check_inside(path, opened, root)
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = "directory" if stat.S_ISDIR(mode) else "FIFO" if stat.S_ISFIFO(mode) else "device or socket"
            raise NotRegularFileError(f"{path} is a {kind}, expected a regular file")
        os.set_blocking(fd, True)
        return io.FileIO(fd, "rb", closefd=True)
    except BaseException:
        os.close(fd)
        raise


def _check_inside(path: str, real: str, root: str) -> None:
    if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
        raise OutsideRootError(
            f"{path} resolves to {real}, outside the checkpoint root {root}: a symbolic link that leaves the root "
            "is never read, written or deleted through. Remove the link, or copy what it points to into the root"
        )


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _rename_noreplace(src: str, dst: str) -> None:
    """rename(2) that fails with FileExistsError if ``dst`` exists: renameat2(RENAME_NOREPLACE) where the kernel
    and file system offer it; otherwise rename(2), which cannot replace a non-empty directory either."""
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):  # EINVAL: this file system lacks the flag
            raise OSError(err, os.strerror(err), dst)
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), dst)
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
            raise FileExistsError(errno.EEXIST, f"{dst} exists and is not empty", dst) from e
        raise


class _LocalWriter:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write(self, data: memoryview) -> None:
        assert self._fd is not None, "write after close"
        while data:
            n = os.write(self._fd, data)
            data = data[n:]

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def abort(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)


class LocalStorage:
    """A directory on a local or network file system (NFS, Lustre, a mounted volume)."""

    kind = "local"

    def __init__(self, root: str, *, direct_io: bool = True) -> None:
        # Resolved once: the root may itself be a link (to a mounted volume); nothing under it may leave it.
        self.root = os.path.realpath(os.path.abspath(os.path.expanduser(root)))
        self.direct = direct_io
        """Write data files with O_DIRECT where the file system allows it (see `preemptible.store.direct`)."""

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def inside(self, path: str) -> str:
        """``path``, once it is known to resolve inside the root.

        Raises:
            OutsideRootError: a symbolic link on the way leads out of the root.
        """
        _check_inside(path, os.path.realpath(path), self.root)
        return path

    def escapes(self, path: str) -> str | None:
        """Where ``path`` leads when a symbolic link on it takes it anywhere but to itself: outside the root, or to
        another place inside it (a step directory that links to another step would have markers written into,
        and a commit retracted from, the step it points to). None when it is what it says."""
        real = os.path.realpath(path)
        own = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        return None if real == own else real

    def makedirs(self, path: str) -> None:
        os.makedirs(self.inside(path), exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self.inside(path)))
        except FileNotFoundError:
            return []

    def isdir(self, path: str) -> bool:
        return os.path.isdir(self.inside(path))

    def exists(self, path: str) -> bool:
        return os.path.exists(self.inside(path))

    def size(self, path: str) -> int:
        return os.stat(self.inside(path)).st_size

    def newest_mtime(self, path: str) -> float | None:
        """The newest modification time of ``path`` and, for a directory, of everything directly in it."""
        try:
            newest = os.stat(self.inside(path)).st_mtime
        except FileNotFoundError:
            return None
        if os.path.isdir(path):
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                    except FileNotFoundError:
                        continue
        return newest

    def open_write(self, path: str) -> WriteStream:
        self.inside(path)
        if self.direct:
            fd = direct.open_direct(path)
            if fd is not None:
                return direct.DirectWriter(path, fd)
        return _LocalWriter(path)

    def open_read(self, path: str) -> ReadStream:
        return _open_regular(path, self.root)

    def read_range(self, path: str, offset: int, buffer: memoryview) -> int:
        with _open_regular(path, self.root) as f:
            got = 0
            while got < len(buffer):
                n = os.preadv(f.fileno(), [buffer[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got

    def read_bytes(self, path: str, limit: int) -> bytes:
        with _open_regular(path, self.root) as f:
            size = os.fstat(f.fileno()).st_size
            if size > limit:
                raise FileTooLargeError(f"{path} is {size} bytes, larger than the {limit} expected of it")
            # its size, not the limit: a read of limit + 1 allocates that much first (64 MiB for a manifest)
            data = f.read(size + 1)
            if len(data) > size:  # it grew since, or its size says nothing (procfs): on, up to the limit
                data += f.read(limit + 1 - len(data))
        if len(data) > limit:
            raise FileTooLargeError(f"{path} is larger than the {limit} bytes expected of it")
        return data

    def publish(self, path: str, data: bytes) -> None:
        # IMPORTANT: the commit point. Temp name in the same directory (same device, no copy), fsync, atomic
        # rename, then fsync of the directory so the new name itself survives a power cut.
        self._through_temp(path, data, os.replace)

    def publish_new(self, path: str, data: bytes) -> None:
        # A hard link cannot replace an existing name: the one atomic "create if absent" POSIX (and NFS) offer.
        self._through_temp(path, data, os.link)

    def _through_temp(self, path: str, data: bytes, place: Any) -> None:
        """Write ``data`` durably under a temp name beside ``path``, ``place(tmp, path)`` it, fsync the directory."""
        tmp = f"{self.inside(path)}.tmp-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            w = _LocalWriter(tmp)
            try:
                w.write(memoryview(data))
            except BaseException:
                w.abort()
                raise
            w.close()
            place(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)  # nothing left after a rename; the temp name after a link
        self.sync_dir(os.path.dirname(path))

    def commit_dir(self, src: str, dst: str) -> None:
        # IMPORTANT: the commit point of a local save: a complete directory appears under its step's name at
        # once, and never over one that is there (a committed step is never written again, by anyone).
        _rename_noreplace(self.inside(src), self.inside(dst))
        self.sync_dir(os.path.dirname(dst))

    def append_text(self, path: str) -> Any:
        return open(self.inside(path), "a", encoding="utf-8")

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not os.path.islink(path):  # a link itself is removed, never what it points to
                self.inside(path)
            os.unlink(path)

    def remove_tree(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            if os.path.islink(path) or not os.path.isdir(path):  # a link is never deleted through; rmtree itself
                os.unlink(path if os.path.islink(path) else self.inside(path))  # never follows links inside
                return
            shutil.rmtree(self.inside(path))

    def move(self, src: str, dst: str) -> None:
        os.replace(src, self.inside(dst))

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        except OSError as e:  # some network file systems refuse fsync on directories
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
                raise
        finally:
            os.close(fd)


def storage_for(root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None) -> Storage:
    """The storage for a local path or an fsspec URL (``s3://``, ``gs://``, ``az://``, ``memory://``)."""
    if roots.is_url(root):
        from preemptible.store.objstore import FsspecStorage

        return FsspecStorage(os.fspath(root), storage_options)
    return LocalStorage(roots.local_path(root))


EPHEMERAL_PREFIXES = (
    "/dev/shm",
    "/run/",
    "/mnt/resource",
    "/mnt/ephemeral",
    "/mnt/disks/local-ssd",
    "/local_disk0",
    "/media/ephemeral",
    "/scratch/local",
)
TMPFS_MAGIC = (0x01021994, 0x858458F6)  # tmpfs, ramfs


def ephemeral_reason(storage: Storage) -> str | None:
    """Why the root will not outlive the machine (tmpfs, a known instance-store mount), or None."""
    if storage.kind != "local":
        return None
    path = os.path.realpath(storage.root)
    probe = path
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    fstype = _fs_type(probe)
    if fstype is not None and fstype in TMPFS_MAGIC:
        return f"{path} is on tmpfs (memory): it is gone when the machine is"
    for prefix in EPHEMERAL_PREFIXES:
        if path == prefix.rstrip("/") or path.startswith(prefix.rstrip("/") + "/"):
            return f"{path} is under {prefix.rstrip('/')}, an instance-local (ephemeral) disk on common clouds"
    return None


def _fs_type(path: str) -> int | None:
    """statfs f_type on Linux (via ctypes; os.statvfs does not report it)."""
    import ctypes
    import ctypes.util

    class StatFS(ctypes.Structure):
        _fields_ = [("f_type", ctypes.c_long), ("rest", ctypes.c_byte * 120)]

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        buf = StatFS()
        if libc.statfs(path.encode(), ctypes.byref(buf)) != 0:
            return None
        return int(buf.f_type) & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None
