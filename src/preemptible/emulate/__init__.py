"""Loopback emulators of the AWS, GCP and Azure metadata services, for tests and rehearsals."""

from preemptible.emulate.aws import AwsEmulator
from preemptible.emulate.azure import AzureEmulator
from preemptible.emulate.base import Emulator
from preemptible.emulate.gcp import GcpEmulator

EMULATORS: dict[str, type[Emulator]] = {"aws": AwsEmulator, "gcp": GcpEmulator, "azure": AzureEmulator}

__all__ = ["EMULATORS", "AwsEmulator", "AzureEmulator", "Emulator", "GcpEmulator"]
