"""A checkpoint root opened for reading only: its listing and the one verified read path, nothing that writes.

What `load` and every export read through (`preemptible.export`): the same `Reader` and `Listing` a
`Checkpointer` owns, without its write side.
"""

from __future__ import annotations

import errno
import os
from typing import Any

from preemptible.checkpoint.listing import Listing
from preemptible.checkpoint.reader import Reader
from preemptible.store.io import Storage, storage_for
from preemptible.store.layout import CheckpointInfo
from preemptible.store.markers import Markers
from preemptible.store.threads import threads_for


class ReadOnlyRoot:
    """The committed checkpoints under ``root`` (a local path or an object-store URL), for reading.

    Raises:
        NotADirectoryError: a local ``root`` that is a file or a device.
    """

    def __init__(self, root: str | os.PathLike[str], *, storage_options: dict[str, Any] | None = None) -> None:
        self.storage: Storage = storage_for(root, storage_options)
        self.root = self.storage.root
        if self.storage.kind == "local" and os.path.exists(self.root) and not os.path.isdir(self.root):
            raise NotADirectoryError(
                errno.ENOTDIR,
                f"checkpoint root {root} is a file or device, expected a directory (or a path where one can be made)",
                os.fspath(root),
            )
        self.threads = threads_for(self.storage.kind)
        self.reader = Reader(self.storage, self.root, threads=self.threads)
        self.listing = Listing(self.storage, self.root, markers=Markers(self.storage), reader=self.reader)

    def checkpoints(self) -> list[CheckpointInfo]:
        """Every committed checkpoint under the root, oldest first."""
        return self.listing.checkpoints()
