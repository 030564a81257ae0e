"""`Run`'s options, checked once when it is built (the exit policy they set is `emergency.ExitPolicy`).

Every option is validated here with a message that says what was expected and what was found, so a bad value is
an error at construction, never a surprise at the first save (``keep=2.5``, ``save_interval_s=nan``).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any

from preemptible import dist
from preemptible.emergency import ExitPolicy
from preemptible.events import Advisory
from preemptible.validate import DEFAULT_RTOL


def _whole(name: str, value: object, minimum: int, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        none = " or None" if optional else ""
        raise ValueError(f"expected {name} to be a whole number >= {minimum}{none}, found {value!r}")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """The checked options of one `Run` (see its docs for each)."""

    save_every: int | None = None
    save_interval_s: float | None = None
    save_every_epochs: int | None = None
    keep: int = 2
    prestage_every: int | None = None
    on_advisory: Advisory = Advisory.SAVE
    exit_code: int | None = None
    requeue: bool | None = None
    per_rank: tuple[str, ...] = ()
    probe_rtol: float = DEFAULT_RTOL
    peer_timeout_s: float | None = None

    def __post_init__(self) -> None:
        dist.peer_timeout(self.peer_timeout_s)  # a bad value (or environment variable) is an error here
        _whole("save_every", self.save_every, 1)
        _whole("save_every_epochs", self.save_every_epochs, 1)
        _whole("prestage_every", self.prestage_every, 1)
        _whole("keep", self.keep, 2, optional=False)
        s = self.save_interval_s
        if s is not None and (isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s < math.inf):
            raise ValueError(f"expected save_interval_s to be a finite number of seconds > 0 or None, found {s!r}")
        if self.exit_code is not None and (isinstance(self.exit_code, bool) or not isinstance(self.exit_code, int)):
            raise ValueError(f"expected exit_code to be an integer or None, found {self.exit_code!r}")
        r = self.probe_rtol
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0 <= r < math.inf:
            raise ValueError(
                f"expected probe_rtol to be a finite relative tolerance >= 0 (default {DEFAULT_RTOL}), found {r!r}"
            )

    @classmethod
    def build(
        cls,
        state: Collection[str],
        reserved: Collection[str],
        *,
        per_rank: Iterable[str] | str,
        on_advisory: str,
        **kw: Any,
    ) -> RunOptions:
        """Check and normalise: ``per_rank`` names state entries, ``on_advisory`` is one of `Advisory`."""
        names = [per_rank] if isinstance(per_rank, str) else list(per_rank)
        if not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"expected per_rank to list state names (str), found {names!r}. per_rank is one of Run's own "
                f"keywords ({sorted(reserved)}), which cannot name a state entry: rename that entry"
            )
        unknown = [n for n in names if n not in state]
        if unknown:
            raise ValueError(
                f"per_rank names {unknown}, which are not state entries of this Run (it has {sorted(state)}); "
                "name the keyword arguments you pass as state"
            )
        if on_advisory not in {a.value for a in Advisory}:
            raise ValueError(f"expected on_advisory to be 'save', 'stop' or 'ignore', found {on_advisory!r}")
        return cls(per_rank=tuple(names), on_advisory=Advisory(on_advisory), **kw)

    @property
    def peer_timeout(self) -> float:
        """The peer watch's timeout in seconds (0: off), resolved as `preemptible.dist.peer_timeout` says."""
        return dist.peer_timeout(self.peer_timeout_s)

    @property
    def exit_policy(self) -> ExitPolicy:
        return ExitPolicy(exit_code=self.exit_code, requeue=self.requeue)
