"""Which platform is this, and which notice sources should run: decided from local evidence only.

Cloud: DMI files (``/sys/class/dmi/id``: ``sys_vendor``, ``product_name``, ``bios_vendor``, ``bios_version``,
``chassis_asset_tag``) and ``/sys/hypervisor/uuid``; scheduler: ``SLURM_JOB_ID``, ``KUBERNETES_SERVICE_HOST``.
No network request is made to decide: a process that is not on a cloud sends no metadata request at all, and a
cloud's metadata service is asked only once the machine is known to be on that cloud.

``PREEMPTIBLE_DMI_DIR`` replaces ``/sys/class/dmi/id`` (and ``<dir>/hypervisor_uuid`` replaces
``/sys/hypervisor/uuid``), so tests and rehearsals can pose as any cloud.

Explicit control always wins: ``PREEMPTIBLE_SOURCES`` (``signal,aws,gcp,azure``), ``PREEMPTIBLE_GRACE`` (seconds
from a signal to the hard kill), and ``Guard(sources=...)``.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from preemptible.errors import NoticeSourceError
from preemptible.notice import Clock, NoticeSource
from preemptible.sources.signals import check_grace

SOURCES_ENV = "PREEMPTIBLE_SOURCES"
GRACE_ENV = "PREEMPTIBLE_GRACE"
DMI_ENV = "PREEMPTIBLE_DMI_DIR"
DEFAULT_DMI_DIR = "/sys/class/dmi/id"
DEFAULT_HYPERVISOR_UUID = "/sys/hypervisor/uuid"
AZURE_ASSET_TAG = "7783-7084-3265-9085-8269-3286-77"
CLOUD_SOURCES = ("aws", "gcp", "azure")

# Notice windows by platform (seconds from notice to hard stop), as documented by each provider.
WINDOWS = {"aws": 120.0, "gcp": 30.0, "azure": 30.0, "gke": 15.0, "k8s": 30.0, "slurm": 60.0, "local": 30.0}


@dataclass(frozen=True, kw_only=True)
class Platform:
    """Where this process runs, as far as local evidence tells.

    Attributes:
        name: the platform whose window applies: ``slurm``, ``gke``, ``k8s``, ``aws``, ``gcp``, ``azure`` or
            ``local``.
        cloud: ``aws``, ``gcp``, ``azure`` or None.
        scheduler: ``slurm``, ``k8s`` or None.
        grace: seconds from each signal to the hard kill (the deadline of signal notices).
        window_s: the notice window this platform gives (for budgeting).
        exit_code: the default exit code after an emergency save (143 on Kubernetes, else 0).
        evidence: why, in words.
    """

    name: str
    cloud: str | None = None
    scheduler: str | None = None
    grace: Mapping[signal.Signals, float] = field(default_factory=dict)
    window_s: float = 30.0
    exit_code: int = 0
    evidence: tuple[str, ...] = ()

    def grace_for(self, sig: signal.Signals) -> float:
        return self.grace.get(sig, 30.0)


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def detect_cloud(
    env: Mapping[str, str] | None = None,
    *,
    dmi_dir: str | None = None,
    hypervisor_uuid: str = DEFAULT_HYPERVISOR_UUID,
) -> tuple[str | None, str]:
    """(cloud or None, evidence) from DMI files and the Xen hypervisor UUID."""
    env = os.environ if env is None else env
    posed = dmi_dir or env.get(DMI_ENV)
    root = Path(posed or DEFAULT_DMI_DIR)
    if posed and hypervisor_uuid == DEFAULT_HYPERVISOR_UUID:
        hypervisor_uuid = str(root / "hypervisor_uuid")  # a posed machine brings all its evidence along
    dmi = {
        k: _read(root / k)
        for k in ("sys_vendor", "product_name", "bios_vendor", "bios_version", "chassis_asset_tag", "board_vendor")
    }
    low = {k: v.lower() for k, v in dmi.items()}
    if "amazon" in low["sys_vendor"] or "amazon" in low["bios_vendor"] or "amazon" in low["bios_version"]:
        return "aws", f"DMI says {dmi['sys_vendor'] or dmi['bios_vendor'] or dmi['bios_version']!r} ({root})"
    if _read(Path(hypervisor_uuid)).lower().startswith("ec2"):
        return "aws", f"Xen hypervisor UUID starts with ec2 ({hypervisor_uuid})"
    if (
        dmi["product_name"] == "Google Compute Engine"
        or "google" in low["sys_vendor"]
        or low["bios_vendor"] == "google"
    ):
        return "gcp", f"DMI product {dmi['product_name'] or dmi['sys_vendor']!r} ({root})"
    if dmi["chassis_asset_tag"] == AZURE_ASSET_TAG:
        return "azure", f"DMI chassis asset tag is Azure's ({root})"
    return None, f"no cloud vendor in {root}"


def _slurm_signal_lead(env: Mapping[str, str]) -> tuple[signal.Signals, float] | None:
    """The ``--signal`` of this job when visible (``SBATCH_SIGNAL``, e.g. ``B:USR1@90``)."""
    text = env.get("SBATCH_SIGNAL", "").strip()
    m = re.fullmatch(r"(?:[RB]+:)?(?:SIG)?([A-Z0-9]+)(?:@(\d+))?", text.upper())
    if not m:
        return None
    name, secs = m.group(1), m.group(2)
    try:
        sig = signal.Signals[f"SIG{name}"] if not name.isdigit() else signal.Signals(int(name))
    except (KeyError, ValueError):
        return None
    return sig, float(secs) if secs else 60.0


def detect_platform(
    env: Mapping[str, str] | None = None,
    *,
    dmi_dir: str | None = None,
    hypervisor_uuid: str = DEFAULT_HYPERVISOR_UUID,
) -> Platform:
    """The platform from local evidence; ``PREEMPTIBLE_GRACE`` overrides every signal's grace."""
    env = os.environ if env is None else env
    cloud, cloud_why = detect_cloud(env, dmi_dir=dmi_dir, hypervisor_uuid=hypervisor_uuid)
    evidence = [cloud_why]
    if env.get("SLURM_JOB_ID"):
        lead = _slurm_signal_lead(env)
        usr1 = lead[1] if lead and lead[0] == signal.SIGUSR1 else 60.0
        grace = {signal.SIGUSR1: usr1, signal.SIGTERM: 30.0, signal.SIGINT: 30.0}
        if lead and lead[0] not in grace:
            grace[lead[0]] = lead[1]
        evidence.append(
            f"SLURM_JOB_ID={env['SLURM_JOB_ID']}"
            + (
                f", SBATCH_SIGNAL={env['SBATCH_SIGNAL']}"
                if lead
                else "; --signal lead unknown, assuming 60 s (set PREEMPTIBLE_GRACE to say)"
            )
        )
        platform = Platform(
            name="slurm", cloud=cloud, scheduler="slurm", grace=grace, window_s=usr1, evidence=tuple(evidence)
        )
    elif env.get("KUBERNETES_SERVICE_HOST"):
        gke = cloud == "gcp"
        window = WINDOWS["gke" if gke else "k8s"]
        evidence.append(
            "KUBERNETES_SERVICE_HOST is set"
            + (
                " on GCP: GKE, Spot pods get about 15 s"
                if gke
                else "; pod grace assumed 30 s (terminationGracePeriodSeconds)"
            )
        )
        platform = Platform(
            name="gke" if gke else "k8s",
            cloud=cloud,
            scheduler="k8s",
            grace=dict.fromkeys((signal.SIGTERM, signal.SIGINT, signal.SIGUSR1), window),
            window_s=window,
            exit_code=143,
            evidence=tuple(evidence),
        )
    else:
        name = cloud or "local"
        platform = Platform(
            name=name,
            cloud=cloud,
            grace=dict.fromkeys((signal.SIGTERM, signal.SIGINT, signal.SIGUSR1), 30.0),
            window_s=WINDOWS[name],
            evidence=tuple(evidence),
        )
    override = env.get(GRACE_ENV, "").strip()
    if override:
        seconds = check_grace(override, f"${GRACE_ENV}")
        platform = Platform(
            name=platform.name,
            cloud=platform.cloud,
            scheduler=platform.scheduler,
            grace=dict.fromkeys(platform.grace or (signal.SIGTERM,), seconds),
            window_s=seconds,
            exit_code=platform.exit_code,
            evidence=(*platform.evidence, f"{GRACE_ENV}={override}"),
        )
    return platform


# sources --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SourceOptions:
    """What every source factory may use."""

    grace: float | None
    clock: Clock
    env: Mapping[str, str]
    platform: Platform


SourceFactory = Callable[[SourceOptions], NoticeSource]


def _signal(opts: SourceOptions) -> NoticeSource:
    from preemptible.sources.signals import SignalSource

    if opts.grace is not None:
        return SignalSource(grace=opts.grace, clock=opts.clock)
    return SignalSource(
        grace=opts.platform.grace_for(signal.SIGTERM), grace_by_signal=opts.platform.grace, clock=opts.clock
    )


def _aws(opts: SourceOptions) -> NoticeSource:
    from preemptible.sources.aws import AwsSource

    return AwsSource(clock=opts.clock, env=opts.env)


def _gcp(opts: SourceOptions) -> NoticeSource:
    from preemptible.sources.gcp import GcpSource

    return GcpSource(clock=opts.clock, env=opts.env)


def _azure(opts: SourceOptions) -> NoticeSource:
    from preemptible.sources.azure import AzureSource

    return AzureSource(clock=opts.clock, env=opts.env)


# One table: name -> factory.
FACTORIES: dict[str, SourceFactory] = {"signal": _signal, "aws": _aws, "gcp": _gcp, "azure": _azure}


def parse_source_names(text: str) -> list[str]:
    names = [part.strip().lower() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in FACTORIES]
    if unknown:
        raise NoticeSourceError(
            f"expected notice sources from {sorted(FACTORIES)} (comma separated), found {', '.join(unknown)!r}; "
            f"fix {SOURCES_ENV} or the sources argument"
        )
    return names


def detect(env: Mapping[str, str], platform: Platform | None = None) -> list[str]:
    """Signals always; the cloud's metadata source when local evidence says which cloud this is."""
    platform = platform or detect_platform(env)
    return ["signal", platform.cloud] if platform.cloud else ["signal"]


def resolve(
    spec: str | Iterable[str | NoticeSource] | None,
    *,
    grace: float | None = None,
    clock: Clock = time.time,
    env: Mapping[str, str] | None = None,
    platform: Platform | None = None,
) -> list[NoticeSource]:
    """Build the sources named by ``spec``.

    Args:
        spec: None (``$PREEMPTIBLE_SOURCES`` if set, else detected), a comma-separated string of names, or an
            iterable of names and ready-made `NoticeSource` objects.
        grace: seconds from a signal to the hard kill; None: the platform's default.
        clock: epoch seconds.
        env: the environment to read (default ``os.environ``).
        platform: the platform (default: detected from ``env``).
    """
    env = os.environ if env is None else env
    platform = platform or detect_platform(env)
    opts = SourceOptions(grace=grace, clock=clock, env=env, platform=platform)
    items: list[str | NoticeSource]
    if spec is None:
        from_env = env.get(SOURCES_ENV, "").strip()
        items = list(parse_source_names(from_env) if from_env else detect(env, platform))
    elif isinstance(spec, str):
        items = list(parse_source_names(spec))
    else:
        items = list(spec)
    sources: list[NoticeSource] = []
    other_local_rank = int(env.get("LOCAL_RANK", "0")) != 0
    for item in items:
        if isinstance(item, str):
            (name,) = parse_source_names(item)
            if name in CLOUD_SOURCES and other_local_rank:
                continue  # metadata is polled once per node, by local rank 0; the notice reaches us via the store
            sources.append(FACTORIES[name](opts))
        elif isinstance(item, NoticeSource):
            sources.append(item)
        else:
            raise NoticeSourceError(
                f"expected a source name or an object with name/start/close, found {type(item).__name__}"
            )
    return sources
