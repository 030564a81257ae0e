"""Names on storage and the ``COMMIT.json`` manifest: its keys, how it is written and how it is checked.

A checkpoint exists if and only if its ``COMMIT.json`` exists. The manifest is read as untrusted input: every
key is type-checked, every file name must be a plain name inside the checkpoint directory, and a format
version newer than this library's is refused with an instruction to upgrade.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, TypeGuard

from preemptible.errors import CheckpointCorruptError
from preemptible.store import bounds

FORMAT_VERSION = 2
"""The newest format this library reads and writes. Version 2 adds compressed tensor files (`COMPRESSED_SUFFIX`); a
checkpoint without them is written as version 1, which any earlier reader reads."""
PLAIN_FORMAT_VERSION = 1
STEP_DIGITS = 12
STEP_RE = re.compile(rf"step-([0-9]{{{STEP_DIGITS}}})", re.ASCII)  # ASCII digits, exact width: fullmatch
COMMIT = "COMMIT.json"
VALID = "VALID.json"
INVALID = "INVALID.json"
STATE = "state.json"
DONE = "DONE.json"
JOURNAL_DIR = "journal"
TENSOR_SUFFIX = ".safetensors"
COMPRESSED_SUFFIX = ".safetensors.zst"
MAX_MANIFEST_BYTES = bounds.MAX_MANIFEST_BYTES
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")


def step_dir(step: int) -> str:
    if not 0 <= step < 10**STEP_DIGITS:
        raise ValueError(f"expected a step from 0 to {10**STEP_DIGITS - 1} (the layout's width), found {step}")
    return f"step-{step:0{STEP_DIGITS}d}"


def parse_step_dir(name: str) -> int | None:
    m = STEP_RE.fullmatch(name)
    return int(m.group(1)) if m else None


ATTEMPT_RE = re.compile(rf"step-([0-9]{{{STEP_DIGITS}}})\.part-([0-9a-f]{{16}})", re.ASCII)
PREFIX_RE = re.compile(r"a-[0-9a-f]{16}", re.ASCII)


def new_token() -> str:
    """A save attempt's own name: 64 random bits, unique across machines writing to one root."""
    return secrets.token_hex(8)


def attempt_dir(step: int, token: str) -> str:
    """On a local file system: where one save attempt of ``step`` is written, then renamed to `step_dir`."""
    return f"{step_dir(step)}.part-{token}"


def parse_attempt_dir(name: str) -> int | None:
    m = ATTEMPT_RE.fullmatch(name)
    return int(m.group(1)) if m else None


def attempt_prefix(token: str) -> str:
    """On an object store: the prefix inside ``step-N/`` that holds one save attempt's data files."""
    return f"a-{token}"


def rank_suffix(rank: int) -> str:
    return f"-r{rank:05d}"


_RANK_FILE = re.compile(r"-r([0-9]{5})(?:\.safetensors|\.safetensors\.zst|\.json)$")


def is_tensor_file(name: str) -> bool:
    """A tensor file: plain safetensors, or compressed (``.safetensors.zst``, see `preemptible.store.compress`)."""
    return name.endswith((TENSOR_SUFFIX, COMPRESSED_SUFFIX))


def with_rank(name: str, rank: int) -> str:
    """``_rng.safetensors`` -> ``_rng-r00001.safetensors``: a file of one rank's own state."""
    stem, dot, ext = name.rpartition(".")
    return f"{stem}{rank_suffix(rank)}{dot}{ext}"


def file_rank(name: str) -> int | None:
    """The rank a per-rank file belongs to, or None for a file every rank reads."""
    m = _RANK_FILE.search(name)
    return int(m.group(1)) if m else None


def safe_file_name(name: str) -> bool:
    """A plain file name: no separators, no ``..``, not absolute, not hidden, not a marker."""
    return bool(_SAFE_NAME.match(name)) and ".." not in name and name not in (COMMIT, VALID, INVALID)


@dataclass(frozen=True)
class Chunks:
    """Checksums of a file's pieces, so that a reader of part of it (a rank restoring its slice of a resharded
    tensor) verifies what it reads without reading the rest.

    The pieces: the header (8-byte length and JSON), then each tensor's data cut every ``bytes`` bytes from the
    tensor's own start (a tensor shorter than that is one piece; an empty one none). ``sums`` concatenates their
    XXH3-64 digests, 16 hex digits each, in file order.
    """

    bytes: int
    sums: str

    def digest(self, i: int) -> str:
        return self.sums[16 * i : 16 * i + 16]

    @property
    def count(self) -> int:
        return len(self.sums) // 16


@dataclass(frozen=True)
class FileRecord:
    bytes: int
    checksum: str
    chunks: Chunks | None = None
    """Tensor files: checksums of the header and of each piece of data, for ranged reads (absent in
    checkpoints written before they were added; such files are read whole)."""

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"bytes": self.bytes, "checksum": self.checksum}
        if self.chunks is not None:
            doc["chunks"] = {"bytes": self.chunks.bytes, "sums": self.chunks.sums}
        return doc

    @classmethod
    def from_doc(cls, rec: Any) -> FileRecord | None:
        """A record as COMMIT.json holds it, or None when it is malformed."""
        if not isinstance(rec, dict) or not _is_int(rec.get("bytes")) or rec["bytes"] < 0:
            return None
        if not isinstance(rec.get("checksum"), str):
            return None
        chunks = rec.get("chunks")
        if chunks is None:
            return cls(rec["bytes"], rec["checksum"])
        size = chunks.get("bytes") if isinstance(chunks, dict) else None
        if not _is_int(size) or size < 4096 or size & (size - 1):  # the writer's sizes: powers of two >= 16 KiB
            return None
        sums = chunks.get("sums")
        if not isinstance(sums, str) or len(sums) % 16 or not _lower_hex(sums):
            return None
        return cls(rec["bytes"], rec["checksum"], Chunks(chunks["bytes"], sums))


def _lower_hex(text: str) -> bool:
    """Whether ``text`` is one or more of 0-9a-f, as hexdigest writes them: checked in C (a manifest holds up to
    4,096 sums per file; a regular expression took 1.7 ms over 9 files' sums, this 0.1 ms)."""
    try:
        raw = bytes.fromhex(text)  # also takes upper case and spaces between bytes, refused below
    except ValueError:
        return False
    return 0 < 2 * len(raw) == len(text) and not any(c in text for c in "ABCDEF")


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The contents of ``COMMIT.json`` (keys are stable and documented in docs/format.md)."""

    format_version: int = PLAIN_FORMAT_VERSION
    step: int
    created: str
    world_size: int
    checksum_algorithm: str
    files: Mapping[str, FileRecord]
    probe: float | None = None
    timings: Mapping[str, float] = field(default_factory=dict)
    predicted_save_s: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    prefix: str = ""
    """Object stores: the attempt prefix (``a-<token>``) inside the step directory that holds the files; empty on
    a local file system (the files sit in the step directory, renamed into place whole)."""

    def file_dir(self, join: Any, directory: str) -> str:
        """Where this manifest's files are, for the step ``directory``."""
        return join(directory, self.prefix) if self.prefix else directory

    @property
    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.files.values())

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format_version": self.format_version,
            "step": self.step,
            "created": self.created,
            "world_size": self.world_size,
            "checksum_algorithm": self.checksum_algorithm,
            "files": {n: f.to_doc() for n, f in sorted(self.files.items())},
            "probe": self.probe,
            "timings": dict(self.timings),
            "predicted_save_s": self.predicted_save_s,
        }
        if self.prefix:
            doc["prefix"] = self.prefix
        doc.update(self.extra)
        return (json.dumps(seal(doc), indent=1, allow_nan=False) + "\n").encode()

    @classmethod
    def from_json(cls, raw: bytes, *, where: str, expect_step: int | None = None) -> Manifest:
        """Parse and check a manifest. Raises CheckpointCorruptError naming what is wrong (a tampered one too:
        nesting too deep for the decoder, numbers too large for a float)."""
        try:
            return cls._parse(raw, where=where, expect_step=expect_step)
        except (RecursionError, OverflowError) as e:
            raise CheckpointCorruptError(
                f"{where}: COMMIT.json cannot be a manifest ({type(e).__name__}: {e}); the checkpoint cannot be "
                "trusted",
                path=where,
                step=expect_step,
            ) from e

    @classmethod
    def _parse(cls, raw: bytes, *, where: str, expect_step: int | None) -> Manifest:
        def bad(why: str) -> CheckpointCorruptError:
            return CheckpointCorruptError(f"{where}: {why}", path=where, step=expect_step)

        doc = _manifest_doc(raw, bad)
        version = doc.get("format_version")
        if not _is_int(version):
            raise bad(f"expected an integer format_version, found {version!r}")
        if version > FORMAT_VERSION:
            raise bad(
                f"format_version {version} is newer than this preemptible understands ({FORMAT_VERSION}); "
                "upgrade preemptible to read it"
            )
        step = doc.get("step")
        if not _is_int(step) or step < 0:
            raise bad(f"expected a non-negative integer step, found {step!r}")
        if expect_step is not None and step != expect_step:
            raise bad(f"COMMIT.json says step {step} but sits in the directory of step {expect_step}")
        files = _file_records(doc.get("files"), bad)
        algo = doc.get("checksum_algorithm")
        if not isinstance(algo, str):
            raise bad(f"expected a checksum_algorithm string, found {algo!r}")
        _one_form_each(files, bad)
        world = _world_of(doc.get("world_size", 1), files, bad)
        probe = doc.get("probe")
        if probe is not None and not isinstance(probe, (int, float)):
            raise bad(f"expected a number or null as probe, found {probe!r}")
        timings = doc.get("timings") or {}
        if not isinstance(timings, dict):
            raise bad("expected 'timings' to be an object")
        predicted = doc.get("predicted_save_s")
        created = doc.get("created", "")
        prefix = doc.get("prefix", "")
        if prefix != "" and not (isinstance(prefix, str) and PREFIX_RE.fullmatch(prefix)):
            raise bad(f"expected 'prefix' to name an attempt (a-<16 hex digits>), found {str(prefix)[:80]!r}")
        _check_seal(doc, bad)
        return cls(
            format_version=version,
            step=step,
            created=str(created),
            world_size=world,
            checksum_algorithm=algo,
            files=files,
            probe=float(probe) if probe is not None else None,
            timings={str(k): float(v) for k, v in timings.items() if isinstance(v, (int, float))},
            predicted_save_s=float(predicted) if isinstance(predicted, (int, float)) else None,
            extra={k: v for k, v in doc.items() if k not in _KNOWN_KEYS},
            prefix=prefix,
        )


SELF_CHECKSUM = "manifest_checksum"


def _canonical_checksum(doc: Mapping[str, Any]) -> str:
    from preemptible.store import checksum

    body = {k: v for k, v in doc.items() if k != SELF_CHECKSUM}
    return checksum.of_bytes(json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode())


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    """Add the manifest's own checksum (over its canonical JSON), so a flipped bit anywhere in COMMIT.json is
    caught, not only in the fields that are checked one by one."""
    doc[SELF_CHECKSUM] = _canonical_checksum(doc)
    return doc


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


_KNOWN_KEYS = {
    "prefix",
    "format_version",
    "step",
    "created",
    "world_size",
    "checksum_algorithm",
    "files",
    "probe",
    "timings",
    "predicted_save_s",
    SELF_CHECKSUM,
}


def _manifest_doc(raw: bytes, bad: Callable[[str], CheckpointCorruptError]) -> dict[str, Any]:
    """COMMIT.json's bytes as the JSON object they must hold."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise bad(f"COMMIT.json is not valid JSON ({e}); the checkpoint cannot be trusted") from e
    if not isinstance(doc, dict):
        raise bad(f"expected COMMIT.json to hold a JSON object, found {type(doc).__name__}")
    return doc


def _file_records(files_doc: Any, bad: Callable[[str], CheckpointCorruptError]) -> dict[str, FileRecord]:
    """COMMIT.json's ``files``: a record per plain file name, at least one."""
    if not isinstance(files_doc, dict) or not files_doc:
        raise bad(f"expected a non-empty 'files' object, found {str(files_doc)[:80]!r}")
    files: dict[str, FileRecord] = {}
    for name, rec in files_doc.items():
        if not isinstance(name, str) or not safe_file_name(name):
            raise bad(f"file name {name!r} is not a plain name inside the checkpoint directory")
        record = FileRecord.from_doc(rec)
        if record is None:
            raise bad(
                f"file {name!r}: expected {{'bytes': int, 'checksum': str, optional 'chunks': {{'bytes': int, "
                f"'sums': hex}}}}, found {str(rec)[:80]}"
            )
        files[name] = record
    return files


def _one_form_each(files: Mapping[str, FileRecord], bad: Callable[[str], CheckpointCorruptError]) -> None:
    """One tensor file stored two ways (plain and compressed): which one holds the state is anyone's guess."""
    forms: dict[str, str] = {}
    for name in files:
        plain = name.removesuffix(".zst") if name.endswith(COMPRESSED_SUFFIX) else name
        if plain in forms:
            raise bad(
                f"COMMIT.json lists {forms[plain]!r} and {name!r}, two stored forms of one file; a save writes "
                "one of them, so one was added to the checkpoint: it cannot be trusted"
            )
        forms[plain] = name


def _world_of(world: Any, files: Mapping[str, FileRecord], bad: Callable[[str], CheckpointCorruptError]) -> int:
    """COMMIT.json's ``world_size``, in bounds and matching the per-rank files it lists."""
    if not _is_int(world) or not 1 <= world <= bounds.MAX_WORLD_SIZE:
        raise bad(f"expected a world_size from 1 to {bounds.MAX_WORLD_SIZE}, found {str(world)[:40]!r}")
    ranks = {r for r in map(file_rank, files) if r is not None}
    if ranks and ranks != set(range(world)):  # every rank of a job writes its own files, or none does
        missing = sorted(set(range(min(world, max(ranks) + 1))) - ranks)[:3]
        raise bad(
            f"world_size {world} does not match the per-rank files it lists ({len(ranks)} rank(s), from "
            f"{min(ranks)} to {max(ranks)}{f', none of ranks {missing}' if missing else ''}); every rank of a "
            "job writes its own files: the checkpoint cannot be trusted"
        )
    return int(world)


def _check_seal(doc: Mapping[str, Any], bad: Callable[[str], CheckpointCorruptError]) -> None:
    """COMMIT.json's own checksum: present, and matching the rest of it."""
    sealed = doc.get(SELF_CHECKSUM)
    if sealed is None:
        unknown = sorted(k for k in doc if k not in _KNOWN_KEYS)
        raise bad(
            f"COMMIT.json has no {SELF_CHECKSUM} (unknown keys: {unknown}); it was altered after it was "
            "written; the checkpoint cannot be trusted"
        )
    if sealed != _canonical_checksum(doc):
        raise bad(
            f"COMMIT.json does not match its own checksum ({SELF_CHECKSUM} {sealed!r}): it was altered after it "
            "was written (bit rot or an edit); the checkpoint cannot be trusted"
        )


@dataclass(frozen=True, kw_only=True)
class CheckpointInfo:
    """One ``step-N`` directory as found on storage.

    Attributes:
        step: completed steps at save time (the next step to run).
        path: the directory.
        committed: its COMMIT.json exists (it is a checkpoint).
        validated: its VALID.json exists (checksums, and the probe when there is one, passed on a restore or
            verify).
        bytes: total bytes of its files per the manifest (on-storage bytes for uncommitted leftovers).
        created: when it was committed (UTC, ISO 8601), or None.
        save_s: seconds the save took (manifest timings), or None.
        predicted_save_s: the prediction made before the save, or None.
        manifest: the parsed COMMIT.json, or None if uncommitted or unreadable.
        error: why the manifest could not be read, or None.
        refused: why the entry is not looked into at all (see below), or None.
        invalid: why a restore rejected it (INVALID.json: a probe mismatch), or None.

    Examples:
        >>> import tempfile, torch
        >>> from preemptible import Checkpointer
        >>> ck = Checkpointer(tempfile.mkdtemp())
        >>> _ = ck.save({"model": torch.nn.Linear(2, 2)}, step=7).wait()
        >>> [(info.step, info.status) for info in ck.checkpoints()]
        [(7, 'committed')]
    """

    step: int
    path: str
    committed: bool
    validated: bool = False
    bytes: int = 0
    created: str | None = None
    save_s: float | None = None
    predicted_save_s: float | None = None
    manifest: Manifest | None = None
    error: str | None = None
    invalid: str | None = None
    refused: str | None = None
    """Why it is not even looked into (a link that leads out of the root), or None. Never restored or deleted."""

    @property
    def status(self) -> str:
        """``uncommitted``, ``committed``, ``validated``, ``invalid``, ``unreadable`` or ``refused``."""
        if self.refused is not None:
            return "refused"
        if not self.committed:
            return "uncommitted"
        if self.error is not None:
            return "unreadable"
        if self.invalid is not None:
            return "invalid"
        return "validated" if self.validated else "committed"


def now_iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
