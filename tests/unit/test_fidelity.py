"""Protocol fidelity: independent clients (botocore, google-auth) talk to our emulators as to the real thing."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from preemptible.emulate import AwsEmulator, GcpEmulator


@pytest.fixture
def imds() -> Iterator[AwsEmulator]:
    with AwsEmulator() as emu:
        yield emu


def test_botocore_imds_fetchers_get_a_token_and_metadata(imds: AwsEmulator) -> None:
    from botocore.utils import InstanceMetadataFetcher, InstanceMetadataRegionFetcher

    region = InstanceMetadataRegionFetcher(base_url=imds.url, env={}).retrieve_region()
    assert region == "us-east-1"
    creds = InstanceMetadataFetcher(base_url=imds.url, env={}).retrieve_iam_role_credentials()
    assert creds["role_name"] == "preemptible-emulated-role" and creds["access_key"].startswith("ASIA")
    puts = [r for r in imds.requests if r.method == "PUT" and r.path == "/latest/api/token"]
    gets = [r for r in imds.requests if r.method == "GET"]
    assert puts and all(r.header("x-aws-ec2-metadata-token") for r in gets)


def test_google_auth_metadata_helpers(monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth.transport.requests
    from google.auth.compute_engine import _metadata

    with GcpEmulator() as emu:
        request = google.auth.transport.requests.Request()
        root = f"{emu.url}/computeMetadata/v1/"
        assert _metadata.get(request, "project/project-id", root=root) == "preemptible-emulated"
        assert _metadata.get(request, "instance/preempted", root=root) == "FALSE"
        info = _metadata.get(request, "instance/service-accounts/default/", root=root, recursive=True)
        assert info["email"].endswith(".iam.gserviceaccount.com")
        monkeypatch.setenv("GCE_METADATA_IP", emu.url.removeprefix("http://"))
        assert _metadata.ping(request, timeout=2, retry_count=1)
        emu.notice()
        assert _metadata.get(request, "instance/preempted", root=root) == "TRUE"
