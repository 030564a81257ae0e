"""Platform and cloud detection from injected evidence; source selection; endpoint validation."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from preemptible import Guard
from preemptible.errors import NoticeSourceError
from preemptible.sources import detect
from preemptible.sources.aws import AwsSource
from preemptible.sources.http import parse_endpoint

DMI = {
    "aws-nitro": {"sys_vendor": "Amazon EC2", "product_name": "g5.xlarge", "bios_vendor": "Amazon EC2"},
    "aws-xen": {"sys_vendor": "Xen", "product_name": "HVM domU", "bios_version": "4.11.amazon"},
    "gcp": {"sys_vendor": "Google", "product_name": "Google Compute Engine", "bios_vendor": "Google"},
    "azure": {
        "sys_vendor": "Microsoft Corporation",
        "product_name": "Virtual Machine",
        "chassis_asset_tag": "7783-7084-3265-9085-8269-3286-77",
    },
    "hyperv-on-prem": {
        "sys_vendor": "Microsoft Corporation",
        "product_name": "Virtual Machine",
        "chassis_asset_tag": "0000-0000",
    },
    "laptop": {"sys_vendor": "LENOVO", "product_name": "20XW"},
}


def dmi(tmp_path: Path, kind: str) -> str:
    d = tmp_path / kind
    d.mkdir()
    for k, v in DMI[kind].items():
        (d / k).write_text(v + "\n")
    return str(d)


@pytest.mark.parametrize(
    ("kind", "cloud"),
    [
        ("aws-nitro", "aws"),
        ("aws-xen", "aws"),
        ("gcp", "gcp"),
        ("azure", "azure"),
        ("hyperv-on-prem", None),
        ("laptop", None),
    ],
)
def test_cloud_from_dmi(tmp_path: Path, kind: str, cloud: str | None) -> None:
    found, why = detect.detect_cloud({}, dmi_dir=dmi(tmp_path, kind), hypervisor_uuid=str(tmp_path / "none"))
    assert found == cloud, why


def test_xen_hypervisor_uuid(tmp_path: Path) -> None:
    (tmp_path / "uuid").write_text("ec2e1916-9099-7caf-fd21-012345abcdef\n")
    found, _ = detect.detect_cloud({}, dmi_dir=str(tmp_path / "missing"), hypervisor_uuid=str(tmp_path / "uuid"))
    assert found == "aws"


def test_sources_follow_the_cloud_and_env_overrides(tmp_path: Path) -> None:
    env = {detect.DMI_ENV: dmi(tmp_path, "gcp")}
    platform = detect.detect_platform(env, hypervisor_uuid=str(tmp_path / "none"))
    assert detect.detect(env, platform) == ["signal", "gcp"]
    names = [s.name for s in detect.resolve(None, env={**env, "PREEMPTIBLE_SOURCES": "signal"}, platform=platform)]
    assert names == ["signal"]
    laptop = detect.detect_platform({detect.DMI_ENV: dmi(tmp_path, "laptop")}, hypervisor_uuid=str(tmp_path / "x"))
    assert detect.detect({}, laptop) == ["signal"]


def test_slurm_platform_uses_signal_lead(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "123", "SBATCH_SIGNAL": "B:USR1@90", detect.DMI_ENV: dmi(tmp_path, "laptop")}
    p = detect.detect_platform(env, hypervisor_uuid=str(tmp_path / "x"))
    assert p.name == "slurm" and p.scheduler == "slurm"
    assert p.grace_for(signal.SIGUSR1) == 90 and p.grace_for(signal.SIGTERM) == 30 and p.window_s == 90
    assert p.exit_code == 0
    p = detect.detect_platform({"SLURM_JOB_ID": "1", detect.DMI_ENV: dmi(tmp_path, "gcp")}, hypervisor_uuid="/x")
    assert p.grace_for(signal.SIGUSR1) == 60 and p.cloud == "gcp"  # lead unknown: SLURM's default 60 s


def test_kubernetes_and_gke(tmp_path: Path) -> None:
    k8s = detect.detect_platform(
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", detect.DMI_ENV: dmi(tmp_path, "laptop")}, hypervisor_uuid="/x"
    )
    assert (k8s.name, k8s.exit_code, k8s.grace_for(signal.SIGTERM)) == ("k8s", 143, 30)
    gke = detect.detect_platform(
        {"KUBERNETES_SERVICE_HOST": "10.0.0.1", detect.DMI_ENV: dmi(tmp_path, "gcp")}, hypervisor_uuid="/x"
    )
    assert (gke.name, gke.exit_code, gke.grace_for(signal.SIGTERM), gke.window_s) == ("gke", 143, 15, 15)


def test_grace_env_overrides(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "1", "PREEMPTIBLE_GRACE": "45", detect.DMI_ENV: dmi(tmp_path, "laptop")}
    p = detect.detect_platform(env, hypervisor_uuid="/x")
    assert p.grace_for(signal.SIGUSR1) == 45 == p.grace_for(signal.SIGTERM)
    with pytest.raises(NoticeSourceError, match="PREEMPTIBLE_GRACE"):
        detect.detect_platform({"PREEMPTIBLE_GRACE": "soon"}, hypervisor_uuid="/x")


def test_guard_signal_grace_comes_from_the_platform(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv(detect.DMI_ENV, dmi(tmp_path, "gcp"))
    guard = Guard("signal")
    (src,) = guard.sources
    assert guard.platform.name == "gke"
    assert src.grace_by_signal[signal.SIGTERM] == 15  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("https://127.0.0.1:1", "scheme"),
        ("127.0.0.1:80", "scheme"),
        ("http://127.0.0.1:8080/latest", "path"),
        ("http://u:p@127.0.0.1", "credentials"),
        ("http://", "no host"),
        ("http://h:99999", "port"),
    ],
)
def test_endpoint_must_be_scheme_host_port(value: str, problem: str) -> None:
    with pytest.raises(NoticeSourceError, match=problem):
        parse_endpoint(value, variable="PREEMPTIBLE_AWS_ENDPOINT")


def test_endpoint_from_env_and_default() -> None:
    assert AwsSource(env={"PREEMPTIBLE_AWS_ENDPOINT": "http://127.0.0.1:8080/"}).endpoint == "http://127.0.0.1:8080"
    assert AwsSource(env={}).endpoint == "http://169.254.169.254:80"


def test_unknown_source_in_env() -> None:
    with pytest.raises(NoticeSourceError, match="oracle"):
        detect.resolve(None, env={"PREEMPTIBLE_SOURCES": "aws,oracle"})
