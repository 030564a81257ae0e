"""AWS EC2 spot interruption notices from the instance metadata service (IMDS).

AWS announces a spot interruption two minutes ahead only through IMDS, which must be polled:
``spot/instance-action`` (``{"action": "terminate"|"stop"|"hibernate", "time": ...}``, 404 until then) and the
legacy ``spot/termination-time``. A rebalance recommendation (``events/recommendations/rebalance``) is a hint
that interruption risk is high: an advisory notice that triggers an early save, not a stop.

IMDSv2: a session token from ``PUT /latest/api/token``, refreshed before it expires; on 401 a new token and one
retry; when the PUT times out (a container behind the default hop limit of 1 never sees the answer), fall back to
IMDSv1 and try tokens again later. AWS serves JSON items as text/plain, so bodies are parsed regardless of type.

Polling every second rather than AWS's suggested 5 s: the service is local and cheap, and each second polled
sooner is a second more of the 120 s window.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping

from preemptible.notice import Clock, Notice, NoticeKind, utc_from_timestamp
from preemptible.sources.base import PollingSource, parse_time
from preemptible.sources.http import MetadataError, Response

ENDPOINT_ENV = "PREEMPTIBLE_AWS_ENDPOINT"
DEFAULT_ENDPOINT = "http://169.254.169.254"
TOKEN_PATH = "/latest/api/token"
INSTANCE_ACTION = "/latest/meta-data/spot/instance-action"
TERMINATION_TIME = "/latest/meta-data/spot/termination-time"
REBALANCE = "/latest/meta-data/events/recommendations/rebalance"
ACTIONS = {"terminate": NoticeKind.TERMINATE, "stop": NoticeKind.STOP, "hibernate": NoticeKind.HIBERNATE}


class AwsSource(PollingSource):
    """Polls IMDS for spot interruption notices and rebalance recommendations.

    Args:
        endpoint: ``http://host:port``; default ``$PREEMPTIBLE_AWS_ENDPOINT`` or http://169.254.169.254.
        interval: seconds between polls (default 1).
        rebalance: report rebalance recommendations as advisory notices (default True).
        token_ttl: seconds asked for each IMDSv2 token (1..21600); refreshed when under a minute is left.
        put_timeout: seconds to wait for a token before falling back to IMDSv1.
        timeout: seconds per metadata GET.
        clock, wait: injected time (tests).
    """

    name = "aws"

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        interval: float | None = None,
        rebalance: bool = True,
        token_ttl: int = 21600,
        put_timeout: float = 1.0,
        timeout: float = 2.0,
        retry_v2_after_s: float = 300.0,
        clock: Clock = time.time,
        wait: Callable[[float], bool] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        super().__init__(
            endpoint or env.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT,
            variable=ENDPOINT_ENV,
            interval=interval,
            clock=clock,
            wait=wait,
        )
        if not 1 <= token_ttl <= 21600:
            raise ValueError(f"expected token_ttl between 1 and 21600 seconds, found {token_ttl}")
        self.rebalance = rebalance
        self.token_ttl = token_ttl
        self.put_timeout = put_timeout
        self.timeout = timeout
        self.retry_v2_after_s = retry_v2_after_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._v1_until = 0.0  # while now < this, skip the token (the PUT timed out)
        self._seen_stop = False
        self._seen_rebalance = False
        self.mode = "v2"

    # token handling ---------------------------------------------------------------------------------------
    def _fetch_token(self) -> None:
        now = self._clock()
        try:
            r = self.http.request(
                "PUT",
                TOKEN_PATH,
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.token_ttl)},
                timeout=self.put_timeout,
            )
        except MetadataError as e:
            if e.kind != "timeout":
                raise
            self._fall_back_to_v1(now, "the token request timed out (hop limit?)")
            return
        if r.status == 200 and r.body.strip():
            self._token = r.text.strip()
            self._token_expires = now + self.token_ttl
            self.mode = "v2"
        elif r.status in (404, 405):
            self._fall_back_to_v1(now, f"the token request got HTTP {r.status}")
        elif r.status == 403:
            raise MetadataError(
                "http 403",
                "PUT /latest/api/token: 403, the instance metadata service is disabled "
                "or forbids tokens; enable IMDS (HttpEndpoint=enabled) to receive spot notices",
            )
        else:
            raise MetadataError(f"http {r.status}", f"PUT {TOKEN_PATH}: HTTP {r.status} {r.text[:100]!r}")

    def _fall_back_to_v1(self, now: float, why: str) -> None:
        self._token = None
        self._v1_until = now + self.retry_v2_after_s
        if self.mode != "v1":
            self.soft(
                "imdsv1 fallback",
                f"{why}; using IMDSv1 (no token) and retrying tokens every {self.retry_v2_after_s:.0f} s",
            )
        self.mode = "v1"

    def _headers(self) -> dict[str, str]:
        now = self._clock()
        if now >= self._v1_until and (self._token is None or self._token_expires - now < 60):
            self._fetch_token()
        return {"X-aws-ec2-metadata-token": self._token} if self._token else {}

    def get(self, path: str) -> Response | None:
        """GET an IMDS item: the response for 200, None for 404; raises MetadataError otherwise."""
        r = self.http.request("GET", path, headers=self._headers(), timeout=self.timeout)
        if r.status == 401:  # token expired or revoked, or tokens now required: new token, one retry
            self._token = None
            self._v1_until = 0.0
            r = self.http.request("GET", path, headers=self._headers(), timeout=self.timeout)
        if r.status == 200:
            return r
        if r.status == 404:
            return None
        raise MetadataError(f"http {r.status}", f"GET {path}: HTTP {r.status} {r.text[:100]!r}")

    # polling -------------------------------------------------------------------------------------------------
    def poll(self) -> Iterable[Notice]:
        found: list[Notice] = []
        if not self._seen_stop:
            notice = self._instance_action() or self._termination_time()
            if notice is not None:
                self._seen_stop = True
                found.append(notice)
        if self.rebalance and not self._seen_rebalance and not self._seen_stop:
            notice = self._rebalance()
            if notice is not None:
                self._seen_rebalance = True
                found.append(notice)
        return found

    def _instance_action(self) -> Notice | None:
        r = self.get(INSTANCE_ACTION)
        if r is None:
            return None
        try:
            doc = json.loads(r.body)
            action = str(doc["action"]).lower()
            kind = ACTIONS[action]
            deadline = parse_time(str(doc["time"]))
        except (ValueError, KeyError, TypeError) as e:
            self.soft(
                "malformed instance-action",
                f"GET {INSTANCE_ACTION}: expected "
                f'{{"action": "terminate|stop|hibernate", "time": "<ISO 8601>"}}, found {r.text[:120]!r} ({e})',
            )
            return None
        if not self.fresh(deadline, "spot instance-action"):
            return None
        now = self._clock()
        return Notice(
            source=self.name,
            kind=kind,
            received_at=utc_from_timestamp(now),
            deadline=deadline,
            detail=f"spot instance-action {action} at {doc['time']}",
        )

    def _termination_time(self) -> Notice | None:
        r = self.get(TERMINATION_TIME)
        if r is None:
            return None
        try:
            deadline = parse_time(r.text)
        except ValueError:
            return None  # documented: a non-time value means no notice
        if not self.fresh(deadline, "spot termination-time"):
            return None
        return Notice(
            source=self.name,
            kind=NoticeKind.TERMINATE,
            received_at=utc_from_timestamp(self._clock()),
            deadline=deadline,
            detail=f"spot termination-time {r.text.strip()}",
        )

    def _rebalance(self) -> Notice | None:
        r = self.get(REBALANCE)
        if r is None:
            return None
        try:
            when = str(json.loads(r.body)["noticeTime"])
        except (ValueError, KeyError, TypeError) as e:
            self.soft(
                "malformed rebalance", f'GET {REBALANCE}: expected {{"noticeTime": ...}}, found {r.text[:120]!r} ({e})'
            )
            return None
        return Notice(
            source=self.name,
            kind=NoticeKind.REBALANCE,
            received_at=utc_from_timestamp(self._clock()),
            deadline=None,
            detail=f"rebalance recommendation at {when}",
        )
