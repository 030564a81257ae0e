"""The GPU check suite: the CUDA paths of preemptible, checked and measured in one run on a machine with one GPU.

    PYTHONPATH=src python3 benchmarks/gpu_suite.py [--out PATH] [--only NAME ...] [--budget 300]

Each check runs in a subprocess of its own with its own time limit (killed on timeout: FAIL "timeout"):

    cuda_check      benchmarks/cuda_check.py: pinned staging, side-stream copies, bit-exact save/restore, CUDA RNG
    sigterm_resume  Run + CUDA loop (bf16 autocast; fp16 + GradScaler), a real SIGTERM mid-run, bit-identical resume
    hf_callback     the HF Trainer callback on the GPU (fp16), SIGTERM mid-run, bit-identical resume
    fsdp2           FSDP2 fully_shard on CUDA, world size 1, save and restore through Checkpointer, bit-identical
    compression     byte-grouped zstd throughput on a ~1 GB bf16/fp32 state; byte grouping on the GPU vs the CPU
    big_save        emergency save of a ~4 GB CUDA state to the local disk and /dev/shm vs torch.save and DCP,
                    the write and D2H ceilings, the async stall, training beside a background save

Before the checks it prints the free space and O_DIRECT support of the working disks and /dev/shm, measures the
disk's fsync'd write bandwidth and sizes the states to fit the time and the space. Results: one PASS/FAIL/SKIP line
per check, and a JSON document at ``--out`` (default ``$OUT/gpu_suite.json``, else a temp dir). Without CUDA every
check is SKIPped (a dry run, exit 0); with CUDA a skipped check counts as FAIL, and the exit code is 1 if any
check failed. ``--cpu-smoke`` runs every check on the CPU with tiny sizes (a test of this script, not of CUDA).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import mmap
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
SRC = os.path.join(REPO, "src")
SCRIPTS = os.path.join(HERE, "gpu_scripts")
GB = 1e9
MIB = 1 << 20
ALIGN = 4096

# name, time limit (s), what it checks. Run in this order: the short correctness checks first, the long
# measurement last (it sizes itself to the time left).
CHECKS: list[tuple[str, float]] = [
    ("cuda_check", 45),
    ("sigterm_resume", 30),
    ("hf_callback", 45),
    ("fsdp2", 30),
    ("compression", 30),
    ("big_save", 150),
]
SMOKE_FACTOR = 6.0  # the CPU smoke test runs on a small, shared machine: longer limits


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    path = env.get("PYTHONPATH", "")
    if SRC not in path.split(os.pathsep):
        env["PYTHONPATH"] = SRC + (os.pathsep + path if path else "")
    env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    env.setdefault("PREEMPTIBLE_SOURCES", "signal")  # no cloud metadata probes (no network there)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    return env


if SRC not in sys.path:
    sys.path.insert(0, SRC)


# the environment ------------------------------------------------------------------------------------------------
def free_bytes(path: str) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def aligned_buffer(nbytes: int) -> mmap.mmap:
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # anonymous mappings are page-aligned


def probe_dir(path: str, probe_bytes: int) -> dict[str, Any]:
    """Free space, whether O_DIRECT open + an aligned write works, and the fsync'd write bandwidth (with O_DIRECT
    when it works, as preemptible writes there), and which write path preemptible takes there."""
    out: dict[str, Any] = {"path": path, "free_bytes": free_bytes(path)}
    try:
        out["device"] = os.stat(path).st_dev
    except OSError as e:
        out["error"] = repr(e)
        return out
    from preemptible.store import direct

    name = os.path.join(path, f".gpu_suite_probe_{os.getpid()}")
    o_direct = getattr(os, "O_DIRECT", 0)
    buf = aligned_buffer(max(probe_bytes, MIB))
    try:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | o_direct, 0o644)
            try:
                os.write(fd, memoryview(buf)[:MIB])
                os.fsync(fd)
                out["o_direct"] = bool(o_direct)
            finally:
                os.close(fd)
        except OSError as e:
            out["o_direct"] = False
            out["o_direct_error"] = f"{type(e).__name__}: {e}"
        with contextlib.suppress(OSError):
            os.remove(name)
        fd2 = direct.open_direct(name)  # what the library decides for this directory
        if fd2 is not None:
            os.close(fd2)
        out["write_path"] = "direct" if fd2 is not None else "buffered"
        out["library_direct_enabled"] = direct.enabled()
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (o_direct if out["o_direct"] else 0)
        t0 = time.perf_counter()
        fd = os.open(name, flags, 0o644)
        try:
            view = memoryview(buf)
            done = 0
            while done < probe_bytes:
                done += os.write(fd, view[: min(64 * MIB, probe_bytes - done)])
            os.fsync(fd)
        finally:
            os.close(fd)
            view.release()
        seconds = time.perf_counter() - t0
        out["probe_bytes"] = probe_bytes
        out["write_GBps"] = round(probe_bytes / seconds / GB, 3)
    except OSError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        buf.close()
        with contextlib.suppress(OSError):
            os.remove(name)
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"cpus": os.cpu_count(), "platform": platform.platform(), "python": sys.version.split()[0]}
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                info[key] = int(value.split()[0]) * 1024
    with contextlib.suppress(AttributeError, OSError):
        info["cpus_usable"] = len(os.sched_getaffinity(0))
    with contextlib.suppress(OSError, StopIteration), open("/proc/cpuinfo") as f:
        info["cpu_model"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    return info


def nvidia_smi() -> str | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        return out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return f"error: {e!r}"


# sizing -----------------------------------------------------------------------------------------------------------
def plan_sizes(disk: dict[str, Any], shm: dict[str, Any] | None, smoke: bool) -> dict[str, Any]:
    """State sizes that fit the time limits and the free space, from the disk's measured write bandwidth."""
    bw = (disk.get("write_GBps") or 0.3) * GB
    free = disk.get("free_bytes") or 0
    if smoke:
        big, shm_big, gb, comp = 48 * MIB, 48 * MIB, 0.03, 24 * MIB
        shm_free = (shm or {}).get("free_bytes") or 0
        return {
            "big_save_bytes": big,
            "big_save_shm_bytes": shm_big if shm_free > 4 * shm_big else 0,
            "cuda_check_gb": gb,
            "compression_bytes": comp,
            "disk_GBps": bw / GB,
        }
    # big_save writes about 13 times its state to the disk (2 rounds of 6 writes, a background save):
    # 50 s of disk at the measured bandwidth, with a margin of 1.5 for torch.save and DCP being slower
    big = min(4 * GB, bw * 50 / 13 / 1.5, free / 3)
    big = max(int(big) // (64 * MIB) * (64 * MIB), 256 * MIB)
    shm_free = (shm or {}).get("free_bytes") or 0
    shm_big = min(big, shm_free / 3)
    shm_big = int(shm_big) // (64 * MIB) * (64 * MIB) if shm_big >= 256 * MIB else 0
    # cuda_check writes its state 4 times a round, 2 rounds: 20 s of disk
    gb = max(0.1, min(1.0, bw * 20 / 8 / 1.5 / GB, free / 4 / GB))
    return {
        "big_save_bytes": big,
        "big_save_shm_bytes": shm_big,
        "cuda_check_gb": round(gb, 2),
        "compression_bytes": int(1 * GB),
        "disk_GBps": bw / GB,
    }


# the parent -------------------------------------------------------------------------------------------------------
def run_child(
    name: str, ctx: dict[str, Any], timeout: float, result_path: str, log_path: str
) -> tuple[dict[str, Any], float]:
    """Run one check in its own process; its result comes back through ``result_path`` (partial figures too,
    written as it goes, so a timeout keeps what was measured)."""
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        name,
        "--ctx",
        json.dumps(ctx),
        "--result",
        result_path,
    ]
    t0 = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: its subprocesses too
            rc = proc.wait()
    seconds = time.monotonic() - t0
    result: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError), open(result_path) as f:
        result = json.load(f)
    if timed_out:
        result["status"] = "fail"
        result["detail"] = f"timeout after {timeout:.0f} s; " + str(result.get("detail", ""))
    elif rc != 0 and result.get("status") != "fail":
        result["status"] = "fail"
        result["detail"] = f"exit code {rc}; " + str(result.get("detail", "no result written"))
    with contextlib.suppress(OSError):
        with open(log_path) as f:
            tail = f.read()[-3000:]
        result["log_tail"] = tail
    result.setdefault("status", "fail")
    result.setdefault("detail", "")
    result.setdefault("figures", {})
    return result, seconds


def parent(args: argparse.Namespace) -> int:
    started = time.monotonic()
    deadline = started + args.budget
    import torch

    cuda = torch.cuda.is_available()
    smoke = args.cpu_smoke
    out_path = args.out
    if out_path is None:
        base = os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_suite-")
        out_path = os.path.join(base, "gpu_suite.json")
    out_dir = os.path.dirname(os.path.abspath(out_path))
    os.makedirs(out_dir, exist_ok=True)
    logs = os.path.join(out_dir, "gpu_suite_logs")
    os.makedirs(logs, exist_ok=True)
    print(f"gpu_suite: results to {out_path}, per-check logs in {logs}", flush=True)

    doc: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": [sys.executable, *sys.argv],
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": cuda,
        "mode": "cpu-smoke" if smoke else ("gpu" if cuda else "dry-run (no CUDA)"),
        "machine": machine(),
        "nvidia_smi": nvidia_smi(),
    }
    if cuda:
        try:
            doc["gpu"] = torch.cuda.get_device_name(0)
            doc["gpu_count"] = torch.cuda.device_count()
        except Exception as e:
            doc["gpu"] = f"error: {e!r}"
    with contextlib.suppress(Exception):
        import preemptible

        doc["preemptible"] = preemptible.__version__
    print(
        f"torch {doc['torch']} (CUDA {doc['torch_cuda']}), GPU {doc.get('gpu')}, nvidia-smi: {doc['nvidia_smi']}, "
        f"{doc['machine'].get('cpus')} CPUs, {doc['machine'].get('MemTotal', 0) / GB:.0f} GB RAM, mode {doc['mode']}",
        flush=True,
    )

    # the disks: free space, O_DIRECT, write bandwidth; then the sizes
    probe_bytes = 8 * MIB if smoke or not cuda else 512 * MIB
    scratch: list[str] = []
    dirs: dict[str, dict[str, Any]] = {}
    for label, base in (("repo", REPO), ("tmp", tempfile.gettempdir()), ("shm", "/dev/shm")):
        if not os.path.isdir(base):
            dirs[label] = {"path": base, "error": "missing"}
            continue
        work = os.path.join(base, ".gpu_suite_work" if label == "repo" else f"gpu_suite_work_{os.getpid()}")
        try:
            os.makedirs(work, exist_ok=True)
            scratch.append(work)
        except OSError as e:
            dirs[label] = {"path": base, "error": repr(e)}
            continue
        small = probe_bytes if label != "shm" else min(probe_bytes, 64 * MIB)
        dirs[label] = probe_dir(work, small)
        d = dirs[label]
        print(
            f"disk {label:4s} {work}: free {(d.get('free_bytes') or 0) / GB:.1f} GB, O_DIRECT "
            f"{'yes' if d.get('o_direct') else 'no ' + str(d.get('o_direct_error', ''))}"
            f", preemptible writes {d.get('write_path', '?')}, fsync'd write {d.get('write_GBps', '?')} GB/s"
            f"{'  ERROR ' + d['error'] if d.get('error') else ''}",
            flush=True,
        )
    doc["disks"] = dirs
    candidates = [dirs[k] for k in ("tmp", "repo") if "write_GBps" in dirs.get(k, {})]
    if not candidates:
        print("gpu_suite: no writable working disk", flush=True)
        candidates = [{"path": tempfile.mkdtemp(), "write_GBps": 0.3, "free_bytes": 10 * GB}]
    # the faster disk with room for the states (same disk: /tmp)
    disk = max(candidates, key=lambda d: (d.get("free_bytes", 0) > 12 * GB, d.get("write_GBps", 0)))
    shm = dirs.get("shm") if "write_GBps" in dirs.get("shm", {}) else None
    sizes = plan_sizes(disk, shm, smoke)
    doc["work_dir"] = disk["path"]
    doc["write_path"] = {k: v.get("write_path") for k, v in dirs.items()}
    doc["sizes"] = sizes
    print(
        f"working disk {disk['path']} (preemptible writes {disk.get('write_path')} there); sizes: big_save "
        f"{sizes['big_save_bytes'] / GB:.2f} GB (shm {sizes['big_save_shm_bytes'] / GB:.2f} GB), cuda_check "
        f"{sizes['cuda_check_gb']} GB, compression {sizes['compression_bytes'] / GB:.2f} GB",
        flush=True,
    )

    ctx_base = {
        "device": "cuda" if cuda and not smoke else "cpu",
        "smoke": smoke,
        "work": disk["path"],
        "shm": shm["path"] if shm else None,
        "sizes": sizes,
        "disk_GBps": sizes["disk_GBps"],
        "shm_GBps": shm.get("write_GBps") if shm else None,
    }
    selected = [(n, lim) for n, lim in CHECKS if not args.only or n in args.only]
    results: dict[str, Any] = {}
    doc["checks"] = results
    failed = 0
    for i, (name, limit) in enumerate(selected):
        rest = sum(min(lim, 20) for _, lim in selected[i + 1 :])  # the least the later checks need
        left = deadline - time.monotonic()
        timeout = limit * (SMOKE_FACTOR if smoke else 1)
        if not smoke:
            timeout = min(timeout, left - rest)
        if not cuda and not smoke:
            res = {"status": "skip", "detail": "no CUDA device (dry run)", "figures": {}, "seconds": 0.0}
        elif timeout < 10:
            res = {"status": "fail", "detail": f"no time left in the {args.budget:.0f} s budget", "figures": {}}
            res["seconds"] = 0.0
        else:
            ctx = {**ctx_base, "limit": timeout, "deadline_epoch": time.time() + timeout}
            res, seconds = run_child(
                name, ctx, timeout, os.path.join(logs, f"{name}.json"), os.path.join(logs, f"{name}.log")
            )
            res["seconds"] = round(seconds, 2)
            res["limit_s"] = round(timeout, 1)
            if cuda and not smoke and res["status"] == "skip":
                res["status"] = "fail"
                res["detail"] = "skipped with CUDA present: " + res["detail"]
        results[name] = res
        failed += res["status"] == "fail"
        print(
            f"{res['status'].upper():4s}  {name:15s} {res.get('seconds', 0):6.1f} s  {res['detail']}"[:2000], flush=True
        )
        if res["status"] == "fail" and res.get("log_tail"):
            print("      last lines of its log:\n" + indent(res["log_tail"][-1500:]), flush=True)
        figures = res.get("figures") or {}
        if figures and res["status"] != "skip":
            print("      " + json.dumps(figures, default=str)[:3000], flush=True)
        write_json(out_path, doc)  # after every check: a suite killed from outside keeps what it has
    for work in scratch:
        shutil.rmtree(work, ignore_errors=True)
    doc["seconds"] = round(time.monotonic() - started, 1)
    doc["failed"] = failed
    write_json(out_path, doc)
    verdict = "dry run: no CUDA, every check skipped" if not cuda and not smoke else f"{failed} failed"
    print(f"gpu_suite: {verdict}; {doc['seconds']} s; results in {out_path}", flush=True)
    return 1 if failed else 0


def indent(text: str) -> str:
    return "\n".join("      | " + line for line in text.rstrip().splitlines())


def write_json(path: str, doc: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    os.replace(tmp, path)


# the children -------------------------------------------------------------------------------------------------------
class Result:
    """A check's result, written to its file after every figure (a timeout keeps what was measured)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.doc: dict[str, Any] = {"status": "fail", "detail": "did not finish", "figures": {}}
        self.notes: list[str] = []
        self.save()

    def fig(self, key: str, value: Any) -> None:
        self.doc["figures"][key] = round(value, 4) if isinstance(value, float) else value
        self.save()

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.notes.append(text)

    def finish(self, status: str, detail: str) -> None:
        self.doc["status"] = status
        self.doc["detail"] = "; ".join([detail, *self.notes]) if self.notes else detail
        self.save()

    def save(self) -> None:
        write_json(self.path, self.doc)


def sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def left(ctx: dict[str, Any]) -> float:
    return float(ctx["deadline_epoch"]) - time.time()


def remove(path: str) -> None:
    if os.path.isdir(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            os.remove(path)


# 1. cuda_check ------------------------------------------------------------------------------------------------------
def check_cuda_check(ctx: dict[str, Any], res: Result) -> None:
    cmd = [
        sys.executable,
        os.path.join(HERE, "cuda_check.py"),
        "--gb",
        str(ctx["sizes"]["cuda_check_gb"]),
        "--rounds",
        "2",
        "--dir",
        ctx["work"],
        "--device",
        ctx["device"],
    ]
    limit = max(5.0, left(ctx) - 2)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=child_env(), check=False)
    out = proc.stdout
    print(out, proc.stderr[-4000:], flush=True)
    passes = [line[6:] for line in out.splitlines() if line.startswith("PASS")]
    fails = [line[6:] for line in out.splitlines() if line.startswith("FAIL")]
    res.fig("passed", passes)
    res.fig("failed", fails)
    for line in out.splitlines():
        m = re.match(r"\s+(\S.*?)\s+([\d.]+) s\s+([\d.]+) GB/s", line)
        if m:
            res.fig(f"{m.group(1)}_s", float(m.group(2)))
            res.fig(f"{m.group(1)}_GBps", float(m.group(3)))
        m = re.match(r"\s+first async stall.* ([\d.]+) s", line)
        if m:
            res.fig("first_async_stall_s", float(m.group(1)))
        if "async stall / D2H ceiling" in line:
            res.fig("summary", line.strip())
    res.fig("gb", ctx["sizes"]["cuda_check_gb"])
    if proc.returncode == 0 and not fails and passes:
        res.finish("pass", f"{len(passes)} checks passed")
    else:
        tail = proc.stderr.strip().splitlines()[-1:] if proc.stderr.strip() else []
        res.finish("fail", f"rc {proc.returncode}; failed: {fails or 'none reported'}; {' '.join(tail)}"[:1500])


# 2. big_save --------------------------------------------------------------------------------------------------------
def big_state(nbytes: int, device: str, d: int) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A stack of bias-free Linear(d, d) layers in bf16 and fp32 AdamW-like moments: 10 bytes per parameter."""
    import torch

    layers = max(1, int(nbytes // (10 * d * d)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(d, d, bias=False, device=device, dtype=torch.bfloat16) for _ in range(layers)]
    )
    params = list(model.parameters())
    with torch.no_grad():
        for p in params:
            p.normal_(0, 0.02)
    moments = {
        "state": {
            i: {
                "exp_avg": torch.randn(p.shape, device=device) * 1e-3,
                "exp_avg_sq": torch.rand(p.shape, device=device) * 1e-6,
            }
            for i, p in enumerate(params)
        },
        "step": 1,
    }
    return model, moments, {"layers": layers, "d": d, "params": sum(p.numel() for p in params)}


def state_nbytes(model: Any, moments: dict[str, Any]) -> int:
    n = sum(p.numel() * p.element_size() for p in model.parameters())
    return n + sum(t.numel() * t.element_size() for s in moments["state"].values() for t in s.values())


def train_step(model: Any, moments: dict[str, Any], x: Any) -> None:
    """A real step: forward, backward, an AdamW-like update of bf16 weights from fp32 moments."""
    import torch

    loss = model(x).float().square().mean()
    loss.backward()
    with torch.no_grad():
        params = list(model.parameters())
        grads = [p.grad.float() for p in params]
        m = [moments["state"][i]["exp_avg"] for i in range(len(params))]
        v = [moments["state"][i]["exp_avg_sq"] for i in range(len(params))]
        torch._foreach_lerp_(m, grads, 0.1)
        torch._foreach_mul_(v, 0.999)
        torch._foreach_addcmul_(v, grads, grads, value=0.001)
        denom = torch._foreach_add(torch._foreach_sqrt(v), 1e-8)
        updates = torch._foreach_div(m, denom)
        for p, u in zip(params, updates, strict=True):
            p.add_(u.to(p.dtype), alpha=-1e-5)
            p.grad = None


def write_ceiling(path: str, host: Any, *, direct_io: bool) -> float:
    """Seconds to write ``host`` (a contiguous uint8 tensor) with os.write and fsync (O_DIRECT when asked)."""
    view = memoryview(host.numpy())
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (getattr(os, "O_DIRECT", 0) if direct_io else 0)
    t0 = time.perf_counter()
    fd = os.open(path, flags, 0o644)
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done : done + min(256 * MIB, len(view) - done)])
        os.fsync(fd)
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def torch_save(obj: Any, path: str) -> None:
    import torch

    torch.save(obj, path)
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def dcp_save(state: dict[str, Any], path: str) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=path)


def check_big_save(ctx: dict[str, Any], res: Result) -> None:
    import torch

    from preemptible import Checkpointer

    device, smoke = ctx["device"], ctx["smoke"]
    cuda = device == "cuda"
    target = ctx["sizes"]["big_save_bytes"]
    d = 1024 if smoke else 4096
    model, moments, shape = big_state(target, device, d)
    nbytes = state_nbytes(model, moments)
    res.fig("state", {**shape, "bytes": nbytes, "weights": "bf16", "moments": "fp32"})
    state = {"model": model, "optimizer": moments}
    disk_bw = ctx["disk_GBps"] * GB
    dests = {"disk": ctx["work"]}
    if ctx["shm"] and ctx["sizes"]["big_save_shm_bytes"] >= nbytes:
        dests["shm"] = ctx["shm"]
    else:
        res.note(
            f"/dev/shm part skipped: {ctx['sizes']['big_save_shm_bytes'] / GB:.2f} GB fits, state {nbytes / GB:.2f} GB"
        )
    bws = {"disk": disk_bw, "shm": max((ctx.get("shm_GBps") or 1.0) * GB, 1e9)}

    # the D2H ceiling: one big copy of the same bytes into pinned memory
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8, pin_memory=cuda)
    skew = (-raw.data_ptr()) % ALIGN
    host = raw[skew : skew + nbytes]  # page-aligned: O_DIRECT writes straight from it
    d2h = []
    for _ in range(3):
        sync(device)
        t0 = time.perf_counter()
        host.copy_(flat, non_blocking=cuda)
        sync(device)
        d2h.append(time.perf_counter() - t0)
    d2h_s = min(d2h)
    res.fig("d2h_ceiling_s", d2h_s)
    res.fig("d2h_ceiling_GBps", nbytes / d2h_s / GB)
    del flat
    aligned = host.data_ptr() % ALIGN == 0 and nbytes % ALIGN == 0

    times: dict[str, list[float]] = {}
    cks = {k: Checkpointer(os.path.join(p, "pe-big"), keep=2) for k, p in dests.items()}
    for ck in cks.values():
        ck.prepare(state)  # as the README's loop does after its first step: no arena (per-tensor .cpu())
    # and with a staging arena laid out ahead (prepare(arena=True), or after a background save, as under `Run`
    # with async periodic saves): the emergency save copies into it on side streams
    ck_arena = Checkpointer(os.path.join(ctx["work"], "pe-arena"), keep=2)
    t0 = time.perf_counter()
    ck_arena.prepare(state, arena=True)
    res.fig("arena_prepare_s", time.perf_counter() - t0)
    res.fig("arena_pinned", bool(ck_arena.staging.pin))
    res.fig("arena_bytes", ck_arena.staging.nbytes)
    step = 0
    partial = []
    factor = {
        "ceiling": 1.0,
        "ceiling_direct": 1.0,
        "preemptible": 1.2,
        "preemptible_arena": 1.2,
        "torch.save": 2.5,
        "dcp": 2.5,
    }
    for r in range(2):
        for dest, base in dests.items():
            ops: list[tuple[str, Callable[[], float]]] = []
            ceil_path = os.path.join(base, "ceiling.bin")
            ops.append(("ceiling", lambda p=ceil_path: write_ceiling(p, host, direct_io=False)))
            if dest == "disk" and aligned and getattr(os, "O_DIRECT", 0):
                ops.append(("ceiling_direct", lambda p=ceil_path: write_ceiling(p, host, direct_io=True)))

            def pe(dest: str = dest, arena: bool = False) -> float:
                nonlocal step
                step += 1
                ck = ck_arena if arena else cks[dest]
                sync(device)
                t0 = time.perf_counter()
                ck.save(state, step, reason="emergency", deadline=time.time() + 120)
                seconds = time.perf_counter() - t0
                remove(ck.path_of(step))
                return seconds

            def ts(base: str = base) -> float:
                path = os.path.join(base, "torch-save.pt")
                sync(device)
                t0 = time.perf_counter()
                torch_save({"model": model.state_dict(), "optimizer": moments}, path)
                seconds = time.perf_counter() - t0
                remove(path)
                return seconds

            def dc(base: str = base) -> float:
                path = os.path.join(base, "dcp-save")
                sync(device)
                t0 = time.perf_counter()
                dcp_save({"model": model.state_dict(), "optimizer": moments}, path)
                seconds = time.perf_counter() - t0
                remove(path)
                return seconds

            ops += [("preemptible", pe), ("torch.save", ts), ("dcp", dc)]
            if dest == "disk":
                ops.append(("preemptible_arena", lambda: pe("disk", arena=True)))
            if r == 1:
                ops.reverse()  # interleaved: the other order in the second round
            for what, fn in ops:
                need = nbytes / bws[dest] * factor[what] + 2
                if left(ctx) < need + 25:  # keep time for the background save and training part
                    partial.append(f"{dest}/{what} round {r + 1}")
                    continue
                try:
                    seconds = fn()
                except Exception as e:
                    res.note(f"{dest}/{what} round {r + 1} failed: {type(e).__name__}: {e}"[:400])
                    traceback.print_exc()
                    continue
                finally:
                    remove(ceil_path)
                times.setdefault(f"{dest}/{what}", []).append(seconds)
                bws[dest] = min(bws[dest], nbytes / seconds * factor[what])  # what the rest may take, measured
                res.fig("save_s", {k: [round(x, 3) for x in v] for k, v in times.items()})
                print(f"round {r + 1} {dest}/{what}: {seconds:.3f} s {nbytes / seconds / GB:.2f} GB/s", flush=True)
    best = {k: min(v) for k, v in times.items()}
    res.fig("save_GBps", {k: round(nbytes / v / GB, 3) for k, v in best.items()})
    ratios: dict[str, float] = {}
    for dest in dests:
        pe_s = best.get(f"{dest}/preemptible")
        if pe_s is None:
            continue
        ceilings = [best[k] for k in (f"{dest}/ceiling", f"{dest}/ceiling_direct") if k in best]
        if ceilings:
            ratios[f"{dest}: preemptible / best fsync'd write ceiling (time)"] = round(pe_s / min(ceilings), 3)
        for other in ("torch.save", "dcp"):
            if f"{dest}/{other}" in best:
                ratios[f"{dest}: {other} / preemptible (time)"] = round(best[f"{dest}/{other}"] / pe_s, 3)
        ratios[f"{dest}: preemptible / D2H ceiling (time)"] = round(pe_s / d2h_s, 3)
        if f"{dest}/preemptible_arena" in best:
            ratios[f"{dest}: preemptible with arena / without (time)"] = round(
                best[f"{dest}/preemptible_arena"] / pe_s, 3
            )
    res.fig("ratios", ratios)

    # the async stall of a periodic save, and training beside it
    if left(ctx) < nbytes / bws["disk"] * 2.5 + 10:
        partial.append("async stall and training slowdown (no time left)")
    else:
        bg = ck_arena  # its arena is laid out already (arena_prepare_s: what the first background save adds)
        x = torch.randn(256 if smoke else 4096, d, device=device, dtype=torch.bfloat16)
        for _ in range(2):  # warm-up
            train_step(model, moments, x)
        sync(device)
        t0 = time.perf_counter()
        for _ in range(3):
            train_step(model, moments, x)
        sync(device)
        step_s = (time.perf_counter() - t0) / 3
        expected_write = nbytes / bws["disk"]
        n = int(min(200, max(5, expected_write / max(step_s, 1e-4))))
        n = min(n, int(max(5, (left(ctx) - expected_write - 10) / 2 / max(step_s, 1e-4))))
        sync(device)
        t0 = time.perf_counter()
        h = bg.save(state, 1000, blocking=False)
        stall = time.perf_counter() - t0
        t1 = time.perf_counter()
        for _ in range(n):
            train_step(model, moments, x)
        sync(device)
        with_save = time.perf_counter() - t1
        still_writing = not h.done()
        second = h.wait()
        sync(device)
        t0 = time.perf_counter()
        for _ in range(n):
            train_step(model, moments, x)
        sync(device)
        alone = time.perf_counter() - t0
        res.fig("async_stall_s", stall)
        res.fig("async_stall_over_d2h", stall / d2h_s)
        res.fig("async_save_s", second.seconds)
        res.fig(
            "training_beside_save",
            {
                "steps": n,
                "step_s_alone": round(alone / n, 5),
                "step_s_with_save": round(with_save / n, 5),
                "slowdown": round(with_save / alone, 3),
                "save_still_writing_after_steps": still_writing,
                "overlap_fraction": round(min(1.0, second.seconds / max(with_save, 1e-9)), 3),
            },
        )
        remove(bg.path_of(1000))
    for p in dests.values():
        remove(os.path.join(p, "pe-big"))
    remove(os.path.join(ctx["work"], "pe-arena"))
    if partial:
        res.fig("skipped_for_time", partial)
    ok = "disk/preemptible" in times
    summary = ", ".join(f"{k} {v}" for k, v in ratios.items() if k.startswith("disk"))
    res.finish(
        "pass" if ok else "fail",
        f"{nbytes / GB:.2f} GB; {summary}" + (f"; partial: {len(partial)} parts skipped for time" if partial else ""),
    )


# 3. sigterm_resume --------------------------------------------------------------------------------------------------
class Proc:
    def __init__(self, cmd: list[str], log: str) -> None:
        self.log = log
        self.file = open(log, "w")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(cmd, stdout=self.file, stderr=subprocess.STDOUT, env=child_env())

    def finish(self, timeout: float) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            rc = rc if rc else -9
        self.file.close()
        with open(self.log) as f:
            return rc, f.read()


def wait_marker(path: str, proc: Proc, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        if proc.proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


def final_line(out: str) -> dict[str, str]:
    for line in reversed(out.splitlines()):
        if line.startswith("final "):
            return dict(kv.split("=", 1) for kv in line[6:].split() if "=" in kv)
    return {}


def preempt_and_resume(  # noqa: PLR0917
    ctx: dict[str, Any], res: Result, label: str, script: str, extra: list[str], marker_step: int, step_time: float
) -> tuple[bool, str]:
    """Reference run and SIGTERM'd run side by side, then the resume; the final digests compared."""
    base = tempfile.mkdtemp(prefix=f"{label}-", dir=ctx["work"])
    marker = os.path.join(base, "marker")
    common = [sys.executable, script, *extra, "--device", ctx["device"]]
    ref = Proc([*common, "--root", os.path.join(base, "ref")], os.path.join(base, "ref.log"))
    cut = Proc(
        [
            *common,
            "--root",
            os.path.join(base, "cut"),
            "--marker",
            marker,
            "--marker-step",
            str(marker_step),
            "--step-time",
            str(step_time),
        ],
        os.path.join(base, "cut.log"),
    )
    try:
        signalled = wait_marker(marker, cut, left(ctx) - 5)
        t_sig = time.monotonic()
        if signalled:
            cut.proc.send_signal(signal.SIGTERM)
        rc_cut, out_cut = cut.finish(left(ctx) - 3)
        res.fig(f"{label}_notice_to_exit_s", time.monotonic() - t_sig)
        rc_ref, out_ref = ref.finish(left(ctx) - 3)
        if not signalled:
            return False, f"{label}: marker never written (rc {rc_cut}): {out_cut[-600:]}"
        if rc_cut != 0 or rc_ref != 0:
            return (
                False,
                f"{label}: exit codes cut {rc_cut}, reference {rc_ref}: {(out_cut if rc_cut else out_ref)[-800:]}",
            )
        if final_line(out_cut):
            return False, f"{label}: the SIGTERM'd run finished instead of stopping (signal too late)"
        last = max((int(line.split()[1]) for line in out_cut.splitlines() if re.match(r"step \d+", line)), default=-1)
        res2 = Proc([*common, "--root", os.path.join(base, "cut")], os.path.join(base, "resume.log"))
        rc_res, out_res = res2.finish(left(ctx) - 2)
        if rc_res != 0:
            return False, f"{label}: resume exit code {rc_res}: {out_res[-800:]}"
        a, b = final_line(out_ref), final_line(out_res)
        res.fig(f"{label}", {"marker_step": marker_step, "last_step_run": last, "reference": a, "resumed": b})
        same = bool(a.get("digest")) and a.get("digest") == b.get("digest") and a.get("scale") == b.get("scale")
        resumed_from = b.get("resumed_from") or b.get("resumed")
        if not same:
            return False, f"{label}: digests differ: reference {a} vs resumed {b}"
        if resumed_from in (None, "None", "False"):
            return False, f"{label}: the second run did not resume ({b})"
        return True, f"{label}: stopped after step {last}, resumed ({resumed_from}), digest {a['digest']} identical"
    finally:
        for p in (ref, cut):
            if p.proc.poll() is None:
                p.proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def check_sigterm_resume(ctx: dict[str, Any], res: Result) -> None:
    script = os.path.join(SCRIPTS, "train_cuda.py")
    steps = "60" if ctx["smoke"] else "150"
    with ThreadPoolExecutor(2) as pool:  # both variants at once: the GPU and 16 cores have room for 4 processes
        futures = [
            pool.submit(
                preempt_and_resume,
                ctx,
                res,
                v,
                script,
                ["--variant", v, "--steps", steps, "--save-every", "10"],
                20,
                0.02,
            )
            for v in ("bf16", "fp16")
        ]
        outcomes = [f.result() for f in futures]
    ok = all(o[0] for o in outcomes)
    res.finish("pass" if ok else "fail", " | ".join(o[1] for o in outcomes)[:3000])


# 4. hf_callback -----------------------------------------------------------------------------------------------------
def check_hf_callback(ctx: dict[str, Any], res: Result) -> None:
    try:
        import transformers
    except ImportError as e:
        res.finish("skip", f"transformers not installed: {e}")
        return
    res.fig("transformers", transformers.__version__)
    script = os.path.join(SCRIPTS, "hf_cuda.py")
    ok, detail = preempt_and_resume(ctx, res, "hf", script, ["--epochs", "3"], 10, 0.03)
    res.finish("pass" if ok else "fail", detail[:3000])


# 5. fsdp2 -----------------------------------------------------------------------------------------------------------
def check_fsdp2(ctx: dict[str, Any], res: Result) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard  # older torch

    from preemptible import Checkpointer

    device = ctx["device"]
    cuda = device == "cuda"
    torch.use_deterministic_algorithms(True)
    if cuda:
        torch.cuda.set_device(0)
    base = tempfile.mkdtemp(prefix="fsdp2-", dir=ctx["work"])
    backend = "nccl" if cuda else "gloo"
    dist.init_process_group(backend, init_method=f"file://{os.path.join(base, 'rendezvous')}", rank=0, world_size=1)
    res.fig("backend", backend)
    mesh = init_device_mesh(device, (1,))

    def build() -> tuple[Any, Any]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(256, 8)
        ).to(device)
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(model: Any, opt: Any, steps: range) -> None:
        for s in steps:
            g = torch.Generator().manual_seed(s)
            x = torch.randn(32, 64, generator=g).to(device)
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    def full(model: Any, opt: Any) -> dict[str, Any]:
        out = {
            f"m/{k}": (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
            for k, v in model.state_dict().items()
        }
        for i, entry in opt.state_dict()["state"].items():
            for k, v in entry.items():
                if isinstance(v, torch.Tensor):
                    out[f"o/{i}/{k}"] = (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().cpu().clone()
        return out

    model, opt = build()
    res.fig("param_type", type(next(model.parameters())).__name__)
    train(model, opt, range(5))
    ck = Checkpointer(os.path.join(base, "ckpt"), keep=2)
    from preemptible import RNGState

    state = {"model": model, "optimizer": opt, "rng": RNGState()}
    result = ck.save(state, 5, reason="emergency").wait()
    res.fig("save", {"bytes": result.bytes, "seconds": round(result.seconds, 3), "timings": dict(result.timings)})
    files = sorted(os.listdir(ck.path_of(5)))
    res.fig("files", files)
    saved = full(model, opt)
    train(model, opt, range(5, 10))
    reference = full(model, opt)

    model2, opt2 = build()
    restored = ck.restore({"model": model2, "optimizer": opt2, "rng": RNGState()})
    res.fig("restored_step", restored)
    problems = []
    if restored != 5:
        problems.append(f"restore returned {restored}")
    if "o/0/exp_avg" not in full(model2, opt2):
        # a fresh optimizer has no state: train a step so its moments exist, then restore again over them
        problems.append("optimizer state not restored into a fresh optimizer (no moments after restore)")
    now = full(model2, opt2)
    diff = [k for k, v in saved.items() if k not in now or not torch.equal(v, now[k])]
    if diff:
        problems.append(f"restored state differs from the saved one in {diff[:6]}")
    kinds = {type(p).__name__ for p in model2.parameters()}
    res.fig("restored_param_types", sorted(kinds))
    devices = {str(p.device) for p in model2.parameters()}
    res.fig("restored_param_devices", sorted(devices))
    if cuda and not all(d.startswith("cuda") for d in devices):
        problems.append(f"restored parameters on {devices}")
    train(model2, opt2, range(5, 10))
    after = full(model2, opt2)
    diff = [k for k, v in reference.items() if k not in after or not torch.equal(v, after[k])]
    if diff:
        problems.append(f"5 steps after the restore differ from 10 uninterrupted in {diff[:6]}")
    shutil.rmtree(base, ignore_errors=True)
    if problems:
        res.finish("fail", "; ".join(problems))
    else:
        res.finish("pass", f"saved {len(files)} files at step 5, restored bit-identically, resumed training identical")


# 6. compression -----------------------------------------------------------------------------------------------------
def check_compression(ctx: dict[str, Any], res: Result) -> None:
    import numpy as np
    import torch

    from preemptible.store import compress
    from preemptible.store import format as tensor_format

    device, cuda = ctx["device"], ctx["device"] == "cuda"
    threads = os.cpu_count() or 1
    res.fig("threads", threads)
    total = ctx["sizes"]["compression_bytes"]
    torch.manual_seed(0)
    # a ~1 GB state like a trained one: bf16 weights (N(0, 0.02)) and fp32 moments, a third of the bytes each kind
    n_w = total // 3 // 2
    n_m = total // 3 // 4
    chunk = 32 * MIB
    tensors: dict[str, Any] = {}
    for i in range(0, n_w, chunk):
        tensors[f"w{i}"] = (torch.randn(min(chunk, n_w - i), device=device) * 0.02).to(torch.bfloat16)
    for i in range(0, n_m, chunk):
        tensors[f"m{i}"] = torch.randn(min(chunk, n_m - i), device=device) * 1e-3
        tensors[f"v{i}"] = torch.rand(min(chunk, n_m - i), device=device) * 1e-6
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    res.fig("bytes", nbytes)

    class Null:
        def __init__(self) -> None:
            self.n = 0

        def write(self, data: memoryview) -> None:
            self.n += len(data)

    # (a) the library's path, from the device tensors, all cores
    items = sorted(tensors.items())
    codec = compress.Codec(threads=threads)
    lib = []
    for _ in range(2):
        sink = Null()
        sync(device)
        t0 = time.perf_counter()
        stored, _, _ = compress.write(sink, items, codec=codec)
        lib.append(time.perf_counter() - t0)
    codec.close()
    res.fig("library_write_s", min(lib))
    res.fig("library_GBps", nbytes / min(lib) / GB)
    res.fig("ratio", stored / nbytes)

    # (b) the frames of (a), grouped on the CPU after the D2H copy, vs grouped on the GPU before it; zstd on all
    # cores in both (as compress.encode_frame does, on frames of FRAME_BYTES)
    frame = compress.FRAME_BYTES
    cctx_level = compress.DEFAULT_LEVEL
    pool = ThreadPoolExecutor(threads)
    hosts = {k: torch.empty(t.numel() * t.element_size(), dtype=torch.uint8, pin_memory=cuda) for k, t in items}

    def frames_of(k: str, t: Any) -> list[tuple[int, int, int]]:
        g = t.element_size()
        n = t.numel() * g
        return [(a, min(a + frame, n), g) for a in range(0, n, frame)]

    def zstd_planes(planes: list[Any]) -> int:
        cctx = compress._compressor(cctx_level)
        return sum(len(cctx.compress(p)) for p in planes)

    def cpu_path() -> tuple[float, float, int]:
        sync(device)
        t0 = time.perf_counter()
        for k, t in items:
            hosts[k].copy_(t.reshape(-1).view(torch.uint8), non_blocking=cuda)
        sync(device)
        t_d2h = time.perf_counter() - t0

        def job(k: str, a: int, b: int, g: int) -> int:
            data = hosts[k].numpy()[a:b]
            grouped = np.ascontiguousarray(data.reshape(-1, g).T)
            return zstd_planes([grouped[p] for p in range(g)])

        futures = [pool.submit(job, k, a, b, g) for k, t in items for a, b, g in frames_of(k, t)]
        out = sum(f.result() for f in futures)
        return time.perf_counter() - t0, t_d2h, out

    def group_on_device(t: Any) -> Any:
        """Each frame's bytes as its planes (byte 0 of every element, then byte 1, ...), frame after frame."""
        g = t.element_size()
        raw = t.reshape(-1).view(torch.uint8)
        n = raw.numel()
        whole = n // frame * frame
        parts = []
        if whole:
            parts.append(raw[:whole].view(-1, frame // g, g).transpose(1, 2).contiguous().reshape(-1))
        if n > whole:
            parts.append(raw[whole:].view(-1, g).t().contiguous().reshape(-1))
        return torch.cat(parts) if len(parts) > 1 else parts[0]

    def gpu_path() -> tuple[float, float, int]:
        sync(device)
        t0 = time.perf_counter()
        for k, t in items:
            hosts[k].copy_(group_on_device(t), non_blocking=cuda)
        sync(device)
        t_d2h = time.perf_counter() - t0

        def job(k: str, a: int, b: int, g: int) -> int:
            data = hosts[k].numpy()[a:b]
            step = (b - a) // g
            return zstd_planes([data[p * step : (p + 1) * step] for p in range(g)])

        futures = [pool.submit(job, k, a, b, g) for k, t in items for a, b, g in frames_of(k, t)]
        out = sum(f.result() for f in futures)
        return time.perf_counter() - t0, t_d2h, out

    # the same planes both ways (bit for bit), on one tensor of each dtype
    for k, t in items[:1] + items[-1:]:
        g = t.element_size()
        cpu_bytes = t.reshape(-1).view(torch.uint8).cpu().numpy()
        expect = np.concatenate(
            [np.ascontiguousarray(cpu_bytes[a:b].reshape(-1, g).T).reshape(-1) for a, b, _ in frames_of(k, t)]
        )
        got = group_on_device(t).cpu().numpy()
        if not np.array_equal(expect, got):
            res.finish("fail", f"the GPU grouping of {k} ({t.dtype}) differs from the CPU grouping")
            return
    timings: dict[str, list[tuple[float, float, int]]] = {"cpu_grouping": [], "gpu_grouping": []}
    for _ in range(2):
        timings["cpu_grouping"].append(cpu_path())
        timings["gpu_grouping"].append(gpu_path())
    pool.shutdown()
    # grouping alone, on all cores (no zstd): what the GPU would take off the CPU
    flat = [hosts[k].numpy() for k, _ in items]
    sizes = {k: t.element_size() for k, t in items}

    def group_only(i: int) -> None:
        k = items[i][0]
        g = sizes[k]
        data = flat[i]
        for a in range(0, len(data), frame):
            np.ascontiguousarray(data[a : a + frame].reshape(-1, g).T)

    with ThreadPoolExecutor(threads) as p2:
        t0 = time.perf_counter()
        list(p2.map(group_only, range(len(items))))
        group_s = time.perf_counter() - t0
    best = {k: min(v, key=lambda x: x[0]) for k, v in timings.items()}
    cpu_s, gpu_s = best["cpu_grouping"][0], best["gpu_grouping"][0]
    if best["cpu_grouping"][2] != best["gpu_grouping"][2]:
        res.note(f"compressed sizes differ: {best['cpu_grouping'][2]} vs {best['gpu_grouping'][2]}")
    res.fig(
        "grouping",
        {
            "cpu_grouping_path_s": round(cpu_s, 4),
            "cpu_grouping_path_GBps": round(nbytes / cpu_s / GB, 3),
            "cpu_grouping_d2h_s": round(best["cpu_grouping"][1], 4),
            "gpu_grouping_path_s": round(gpu_s, 4),
            "gpu_grouping_path_GBps": round(nbytes / gpu_s / GB, 3),
            "gpu_grouping_d2h_s": round(best["gpu_grouping"][1], 4),
            "cpu_grouping_alone_s": round(group_s, 4),
            "cpu_grouping_alone_GBps": round(nbytes / group_s / GB, 3),
            "gpu_grouping_pays": gpu_s < 0.95 * cpu_s,
            "speedup": round(cpu_s / gpu_s, 3),
            "compressed_ratio": round(best["gpu_grouping"][2] / nbytes, 4),
        },
    )
    _ = tensor_format  # imported for its presence: the library's format module is what compress.write streams
    res.finish(
        "pass",
        f"library path {nbytes / min(lib) / GB:.2f} GB/s (ratio {stored / nbytes:.3f}); CPU grouping path "
        f"{nbytes / cpu_s / GB:.2f} GB/s vs GPU grouping path {nbytes / gpu_s / GB:.2f} GB/s "
        f"({'pays' if gpu_s < 0.95 * cpu_s else 'does not pay'}: {cpu_s / gpu_s:.2f}x)",
    )


CHILDREN: dict[str, Callable[[dict[str, Any], Result], None]] = {
    "cuda_check": check_cuda_check,
    "big_save": check_big_save,
    "sigterm_resume": check_sigterm_resume,
    "hf_callback": check_hf_callback,
    "fsdp2": check_fsdp2,
    "compression": check_compression,
}


def child(name: str, ctx: dict[str, Any], result_path: str) -> None:
    res = Result(result_path)
    code = 0
    try:
        CHILDREN[name](ctx, res)
    except BaseException as e:  # reported as the check's failure
        traceback.print_exc()
        res.finish("fail", f"{type(e).__name__}: {e}"[:1500])
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter shutdown: a process group, NCCL or gloo threads and CUDA contexts may abort it (the result is
    # written already).
    os._exit(code)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="the results' JSON (default: $OUT/gpu_suite.json, else a temp dir)")
    ap.add_argument("--only", nargs="*", default=None, help=f"run only these checks: {', '.join(n for n, _ in CHECKS)}")
    ap.add_argument("--budget", type=float, default=300.0, help="seconds the whole suite may take")
    ap.add_argument("--cpu-smoke", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--ctx", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, json.loads(args.ctx), args.result)
    if args.only:
        unknown = set(args.only) - {n for n, _ in CHECKS}
        if unknown:
            ap.error(f"unknown checks {sorted(unknown)}")
    sys.exit(parent(args))


if __name__ == "__main__":
    main()
