"""What a checkpoint root names: a local path (``file://`` allowed) or an object-store URL (``s3://``, ``gs://``,
``az://``, ``memory://``, any fsspec scheme). The one place that tells them apart from the text."""

from __future__ import annotations

import os

FILE_SCHEME = "file://"


def is_url(root: str | os.PathLike[str]) -> bool:
    """Whether ``root`` is an object-store URL: a scheme (``...://``) other than ``file://``."""
    text = os.fspath(root)
    return "://" in text and not text.startswith(FILE_SCHEME)


def local_path(root: str | os.PathLike[str]) -> str:
    """A local root's path, without a leading ``file://``."""
    return os.fspath(root).removeprefix(FILE_SCHEME)
