"""Emulator of the AWS EC2 instance metadata service (IMDS) for spot interruptions.

Faithful to the reference: IMDSv2 tokens (``PUT /latest/api/token`` with a TTL of 1..21600 s, 400 otherwise,
403 with ``X-Forwarded-For``), 401 for a missing (when required), invalid or expired token, every item as
text/plain (JSON items included), 404 for ``spot/instance-action``, ``spot/termination-time`` and the rebalance
recommendation until they exist, a fixed notice ``time`` two minutes after the notice. A hop-limit mode makes the
token PUT hang so clients must fall back to IMDSv1.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from preemptible.emulate.base import Emulator, Reply, Request, iso_seconds, text

ACTIONS = ("terminate", "stop", "hibernate")


class AwsEmulator(Emulator):
    """IMDS on loopback.

    Args:
        require_token: IMDSv2 required (HttpTokens=required): requests without a token get 401.
        lead: seconds from notice to the ``time`` in instance-action (120; hibernate gets none).
        action: ``terminate``, ``stop`` or ``hibernate``.
        notice_after: deliver the notice this many seconds after start (None: only when `notice` is called).
        token_put: ``ok``; ``hang`` (behind a hop limit the answer never arrives); ``forbid`` (403).
    """

    provider = "aws"

    def __init__(
        self,
        *,
        require_token: bool = True,
        lead: float = 120.0,
        action: str = "terminate",
        notice_after: float | None = None,
        token_put: str = "ok",
        hang_s: float = 5.0,
        availability_zone: str = "us-east-1a",
        instance_id: str = "i-0123456789abcdef0",
        role: str = "preemptible-emulated-role",
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(host=host, port=port, **({"clock": clock} if clock else {}))
        if action not in ACTIONS:
            raise ValueError(f"expected action among {ACTIONS}, found {action!r}")
        if token_put not in ("ok", "hang", "forbid"):
            raise ValueError(f"expected token_put 'ok', 'hang' or 'forbid', found {token_put!r}")
        self.require_token = require_token
        self.lead = lead
        self.action = action
        self.notice_after = notice_after
        self.token_put = token_put
        self.hang_s = hang_s
        self.tokens: dict[str, float] = {}
        self.instance_action: dict[str, str] | None = None
        self.termination_time: str | None = None
        self.rebalance_time: str | None = None
        self.items: dict[str, str] = {
            "instance-id": instance_id,
            "instance-type": "g5.xlarge",
            "instance-life-cycle": "spot",
            "placement/availability-zone": availability_zone,
            "placement/region": availability_zone[:-1],
            "iam/security-credentials/": role,
            f"iam/security-credentials/{role}": "",  # filled per request (expiry in the future)
        }

    # scenario ----------------------------------------------------------------------------------------------
    def notice(self, action: str | None = None, *, lead: float | None = None) -> dict[str, str]:
        """Publish the interruption notice now; its ``time`` is fixed at now + lead."""
        action = action or self.action
        if action not in ACTIONS:
            raise ValueError(f"expected action among {ACTIONS}, found {action!r}")
        lead = self.lead if lead is None else lead
        when = iso_seconds(self.clock() + (0.0 if action == "hibernate" else lead))
        with self._lock:
            self.instance_action = {"action": action, "time": when}
            self.termination_time = when
        return dict(self.instance_action)

    def rebalance(self) -> str:
        with self._lock:
            self.rebalance_time = iso_seconds(self.clock())
        return self.rebalance_time

    control_rebalance = rebalance

    def revoke_tokens(self) -> None:
        with self._lock:
            self.tokens.clear()

    def state(self) -> dict[str, Any]:
        return {
            **super().state(),
            "instance_action": self.instance_action,
            "rebalance": self.rebalance_time,
            "tokens": len(self.tokens),
            "require_token": self.require_token,
        }

    # protocol ----------------------------------------------------------------------------------------------
    def _tick(self) -> None:
        due = self.notice_after is not None and self.clock() - self.started_at >= self.notice_after
        if due and self.instance_action is None:
            self.notice()

    def handle(self, req: Request) -> Reply:
        self._tick()
        if req.path == "/latest/api/token":
            return self._token(req)
        if req.path.startswith("/latest/meta-data"):
            if req.method not in ("GET", "HEAD"):
                return text("", 405)
            denied = self._check_token(req)
            if denied is not None:
                return denied
            return self._item(req.path.removeprefix("/latest/meta-data").lstrip("/"))
        return text("", 404)

    def _token(self, req: Request) -> Reply:
        if req.method != "PUT":
            return text("", 405)
        if req.header("X-Forwarded-For"):
            return text("", 403)
        if self.token_put == "forbid":
            return text("", 403)
        try:
            ttl = int(req.header("X-aws-ec2-metadata-token-ttl-seconds") or "")
        except ValueError:
            return text("", 400)
        if not 1 <= ttl <= 21600:
            return text("", 400)
        if self.token_put == "hang":
            import time

            time.sleep(self.hang_s)  # behind a hop limit of 1 the answer never reaches the container
        token = secrets.token_urlsafe(40)
        with self._lock:
            self.tokens[token] = self.clock() + ttl
        reply = text(token)
        reply.headers["X-aws-ec2-metadata-token-ttl-seconds"] = str(ttl)
        return reply

    def _check_token(self, req: Request) -> Reply | None:
        token = req.header("X-aws-ec2-metadata-token")
        if token is None:
            return text("", 401) if self.require_token else None
        expiry = self.tokens.get(token)
        if expiry is None or self.clock() >= expiry:
            return text("", 401)
        return None

    def _item(self, item: str) -> Reply:
        with self._lock:
            notice = self._notice_item(item)
            if notice is not None:
                return notice
            if (
                item.startswith("iam/security-credentials/")
                and item != "iam/security-credentials/"
                and item in self.items
            ):
                return text(self._credentials())
            for key in (item, item.rstrip("/"), item.rstrip("/") + "/"):
                if key in self.items:
                    return text(self.items[key])
        return text("", 404)

    def _notice_item(self, item: str) -> Reply | None:
        """The spot and rebalance items (404 while no notice is set), or None for any other item."""
        if item == "spot/instance-action":
            return text(json.dumps(self.instance_action)) if self.instance_action else text("", 404)
        if item == "spot/termination-time":
            return text(self.termination_time) if self.termination_time else text("", 404)
        if item == "events/recommendations/rebalance":
            return text(json.dumps({"noticeTime": self.rebalance_time})) if self.rebalance_time else text("", 404)
        return None

    def _credentials(self) -> str:
        """An instance role's temporary credentials, as IMDS serves them (emulated values)."""
        return json.dumps(
            {
                "Code": "Success",
                "LastUpdated": iso_seconds(self.clock()),
                "Type": "AWS-HMAC",
                "AccessKeyId": "ASIAEMULATEDEMULATED",
                "SecretAccessKey": "emulated/secret",
                "Token": "emulated-session-token",
                "Expiration": iso_seconds(self.clock() + 6 * 3600),
            }
        )
