"""``preemptible export ROOT [--step N] --out DIR``: a checkpoint as plain safetensors files, verified on the way."""

from __future__ import annotations

import argparse
import json
from typing import Any

from preemptible.cli.args import existing_directory, fail, integer, local_directory


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export",
        help="write a checkpoint as plain safetensors files (compressed or striped ones too), verified",
        description=(
            "Writes every tensor file of a committed checkpoint (the newest, or --step N) into --out as a plain "
            "safetensors file with the checkpoint's key names (model/0.weight, optimizer/state/3/exp_avg): "
            "compressed files (.safetensors.zst) are decoded, every byte is checked against its checksum on the "
            "way, and export.json records the step, each file, and the keys held under another key's name (tied "
            "weights, stored once). Exit 0 on success, 1 when a file fails its "
            "checksum (nothing is left in --out), 2 on a usage error."
        ),
    )
    p.add_argument("root", type=existing_directory)
    p.add_argument("--step", type=integer(low=0, high=10**12 - 1), default=None)
    p.add_argument("--out", type=local_directory, required=True, help="an empty or new local directory")
    p.add_argument(
        "--entry",
        default=None,
        metavar="NAME",
        help="only this state entry (e.g. model), as <NAME>.safetensors with its own key names (0.weight, not "
        "model/0.weight), tied weights under each key: what model.load_state_dict() takes, for inference",
    )
    p.add_argument(
        "--format",
        choices=("safetensors", "hf"),
        default="safetensors",
        help="hf: the entry (default model) as the directory Hugging Face's save_pretrained writes, for "
        "from_pretrained (it must have been a transformers PreTrainedModel when saved; needs transformers)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from preemptible.errors import CheckpointCorruptError, CheckpointNotFoundError
    from preemptible.export import export, export_entry, export_hf
    from preemptible.progress import Meter

    meter: Meter | None = None

    def total(n: int) -> None:
        nonlocal meter
        meter = Meter("export", n)

    def add(n: int) -> None:
        if meter is not None:
            meter.add(n)

    try:
        if args.format == "hf":
            result = export_hf(args.root, args.out, args.entry or "model", step=args.step)
        elif args.entry is not None:
            result = export_entry(args.root, args.out, args.entry, step=args.step)
        else:
            result = export(args.root, args.out, step=args.step, on_bytes=add, on_total=total)
    except CheckpointCorruptError as e:  # first: it is a ValueError too
        print(f"FAIL  {e}")
        return 1
    except (CheckpointNotFoundError, FileExistsError, ValueError, ImportError) as e:
        return fail("preemptible export", str(e))
    except OSError as e:  # --out cannot be created or written (read-only, a path through a file, a full disk)
        return fail(
            "preemptible export",
            f"cannot write the export to {args.out}: {e.strerror or e}; expected a directory this process can create "
            "and write: choose another --out",
            1,
        )
    finally:
        if meter is not None:
            meter.close()
    if args.json:
        print(json.dumps(result.to_json(), indent=1))
        return 0
    for name, rec in result.files.items():
        print(f"{name}: {rec['bytes'] / 1e6:.1f} MB (from {rec['from']})")
    print(
        f"exported step {result.step} to {result.out}: {len(result.files)} file(s), "
        f"{result.bytes_written / 1e6:.1f} MB written from {result.bytes_read / 1e6:.1f} MB read, all verified"
    )
    if result.aliases:
        shown = ", ".join(f"{k} -> {v}" for k, v in list(result.aliases.items())[:3])
        more = f" and {len(result.aliases) - 3} more" if len(result.aliases) > 3 else ""
        print(
            f"{len(result.aliases)} key(s) share a tensor held under another key's name (tied weights, stored once): "
            f"{shown}{more}; export.json lists them under 'aliases' (--entry NAME writes them under each key)"
        )
    return 0
