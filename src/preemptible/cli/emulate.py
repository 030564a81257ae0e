"""``preemptible emulate aws|gcp|azure``: run a cloud's metadata service on loopback, to rehearse a notice."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from preemptible.cli.args import PORT, fail, number
from preemptible.emulate import EMULATORS, AwsEmulator, AzureEmulator, Emulator, GcpEmulator

ENV = {"aws": "PREEMPTIBLE_AWS_ENDPOINT", "gcp": "PREEMPTIBLE_GCP_ENDPOINT", "azure": "PREEMPTIBLE_AZURE_ENDPOINT"}


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "emulate",
        help="run an AWS, GCP or Azure metadata emulator on loopback",
        description=(
            "Serve a cloud's metadata service on loopback, faithful to the provider's protocol, so a training "
            "script can rehearse that cloud's notice. Point the script at it with the printed variables. "
            "Trigger the notice with --notice-after, or any time with: curl -X POST URL/_emulator/notice"
        ),
    )
    p.add_argument("cloud", choices=sorted(EMULATORS))
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=PORT, default=0, help="port (default: any free one)")
    p.add_argument(
        "--notice-after",
        type=number(low=0, high=86400),
        default=None,
        metavar="S",
        help="deliver the notice after S seconds",
    )
    p.add_argument("--action", default="terminate", choices=["terminate", "stop", "hibernate"], help="aws only")
    p.add_argument("--no-token-required", action="store_true", help="aws only: allow IMDSv1 (HttpTokens=optional)")
    p.add_argument("--vm-name", default="preemptible-vm", help="azure only: this VM's name")
    p.add_argument(
        "--first-call-delay",
        type=number(low=0, high=3600),
        default=0.0,
        help="azure only: seconds the first call takes",
    )
    p.add_argument(
        "--for",
        dest="duration",
        type=number(low=0, above=True, high=86400 * 365),
        default=None,
        metavar="S",
        help="stop after S seconds",
    )


def build(args: argparse.Namespace) -> Emulator:
    if args.cloud == "aws":
        return AwsEmulator(
            host=args.host,
            port=args.port,
            notice_after=args.notice_after,
            action=args.action,
            require_token=not args.no_token_required,
        )
    if args.cloud == "gcp":
        return GcpEmulator(host=args.host, port=args.port, notice_after=args.notice_after)
    return AzureEmulator(
        host=args.host,
        port=args.port,
        notice_after=args.notice_after,
        vm_name=args.vm_name,
        first_call_delay=args.first_call_delay,
    )


def run(args: argparse.Namespace) -> int:
    try:
        emulator = build(args).start()
    except OSError as e:
        return fail("preemptible emulate", f"cannot listen on {args.host}:{args.port}: {e.strerror or e}")
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"{args.cloud} metadata emulator listening on {emulator.url}", flush=True)
        print(f"  export PREEMPTIBLE_SOURCES=signal,{args.cloud} {ENV[args.cloud]}={emulator.url}", flush=True)
        when = f"after {args.notice_after:g} s" if args.notice_after is not None else "on request"
        print(f"  notice {when}; trigger it now with: curl -X POST {emulator.url}/_emulator/notice", flush=True)
        print("  Ctrl-C to stop", file=sys.stderr, flush=True)
        stop.wait(args.duration)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        emulator.close()
    return 0
