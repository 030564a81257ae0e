"""The notice ``preemptible run`` relays: under the wrapper, a signal stands for a cloud's notice written to a file.

`RelayedSource` wraps the signal source. Its signals are recorded at once, like any signal (the handler does no
I/O); `resolve`, called by the guard in the main thread when it reads the notice, replaces a signal notice with
the one the wrapper wrote to ``$PREEMPTIBLE_NOTICE_FILE`` before signalling: its source, kind and real deadline
(AWS's two minutes, not a signal's default grace). A missing or malformed file leaves the signal's own notice.
"""

from __future__ import annotations

import logging

from preemptible.notice import Notice, NoticeSink, NoticeSource
from preemptible.relay import read_notice_file

log = logging.getLogger("preemptible")


class RelayedSource:
    """A notice source that resolves its signal notices through the wrapper's notice file (see the module docs)."""

    def __init__(self, inner: NoticeSource, path: str) -> None:
        self.inner = inner
        self.path = path
        self.name = inner.name
        self._resolved: tuple[Notice, Notice] | None = None

    def __repr__(self) -> str:
        return f"RelayedSource({self.inner!r}, {self.path!r})"

    def start(self, sink: NoticeSink) -> None:
        self.inner.start(sink)

    def close(self) -> None:
        self.inner.close()

    def resolve(self, notice: Notice) -> Notice:
        """``notice`` as the wrapper relayed it (read once per notice), or unchanged if it is not this source's."""
        if notice.source != self.inner.name:
            return notice
        if self._resolved is not None and self._resolved[0] is notice:
            return self._resolved[1]
        relayed = read_notice_file(self.path)
        resolved = notice
        if relayed is not None:
            log.info(
                "the %s is %s's %s notice relayed by preemptible run", notice.detail, relayed.source, relayed.kind.value
            )
            resolved = Notice(
                source=relayed.source,
                kind=relayed.kind,
                received_at=relayed.received_at,
                deadline=relayed.deadline or notice.deadline,
                detail=f"{relayed.detail}; relayed as {notice.detail} by preemptible run".lstrip("; "),
            )
        self._resolved = (notice, resolved)
        return resolved
