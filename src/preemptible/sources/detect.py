"""Which notice sources to run: from an explicit list, from ``PREEMPTIBLE_SOURCES``, or detected locally.

Detection reads only local evidence (environment, files) and never touches the network, so a process that is
not on a cloud sends no metadata request at all.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

from preemptible.errors import NoticeSourceError
from preemptible.notice import Clock, NoticeSource
from preemptible.sources.signals import DEFAULT_GRACE_S, SignalSource

SOURCES_ENV = "PREEMPTIBLE_SOURCES"

SourceFactory = Callable[["SourceOptions"], NoticeSource]


class SourceOptions:
    """What every source factory may use: grace, clock, environment."""

    def __init__(self, *, grace: float | None, clock: Clock, env: Mapping[str, str]) -> None:
        self.grace = grace
        self.clock = clock
        self.env = env


def _signal_factory(opts: SourceOptions) -> NoticeSource:
    return SignalSource(grace=opts.grace, clock=opts.clock)


# One table: name -> factory. Cloud sources register here as they arrive.
FACTORIES: dict[str, SourceFactory] = {"signal": _signal_factory}


def parse_source_names(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        raise NoticeSourceError(
            f"expected notice sources from {sorted(FACTORIES)} (comma separated), found {', '.join(unknown)!r}; "
            f"fix {SOURCES_ENV} or the sources argument"
        )
    return names


def detect(env: Mapping[str, str]) -> list[str]:
    """The sources that fit this machine, decided from local evidence only. Signals always."""
    return ["signal"]


def resolve(
    spec: str | Iterable[str | NoticeSource] | None,
    *,
    grace: float | None = DEFAULT_GRACE_S,
    clock: Clock = time.time,
    env: Mapping[str, str] | None = None,
) -> list[NoticeSource]:
    """Build the sources named by ``spec``.

    Args:
        spec: None (``$PREEMPTIBLE_SOURCES`` if set, else auto-detect), a comma-separated string of names, or
            an iterable of names and ready-made `NoticeSource` objects.
        grace: seconds from a signal to the hard kill.
        clock: epoch seconds.
        env: the environment to read (default ``os.environ``).
    """
    env = os.environ if env is None else env
    opts = SourceOptions(grace=grace, clock=clock, env=env)
    items: list[str | NoticeSource]
    if spec is None:
        from_env = env.get(SOURCES_ENV, "").strip()
        items = list(parse_source_names(from_env) if from_env else detect(env))
    elif isinstance(spec, str):
        items = list(parse_source_names(spec))
    else:
        items = list(spec)
    sources: list[NoticeSource] = []
    for item in items:
        if isinstance(item, str):
            (name,) = parse_source_names(item)
            sources.append(FACTORIES[name](opts))
        elif isinstance(item, NoticeSource):
            sources.append(item)
        else:
            raise NoticeSourceError(
                f"expected a source name or an object with name/start/close, found {type(item).__name__}"
            )
    return sources
