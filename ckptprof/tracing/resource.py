"""OpenTelemetry resource attributes from local facts only.

Cloud detection reads ``/sys/class/dmi/id`` files; it never calls a metadata
address (the AWS/GCP resource detectors do, so they are not used).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path

from opentelemetry.sdk.resources import OTELResourceDetector, Resource

DMI_DIR = Path("/sys/class/dmi/id")

# substrings of DMI vendor/product strings -> cloud.provider (semantic conventions)
_CLOUD_MARKERS = {
    "amazon": "aws",
    "ec2": "aws",
    "google": "gcp",
    "microsoft corporation": "azure",
    "alibaba": "alibaba_cloud",
    "oraclecloud": "oracle_cloud",
}


def detect_cloud_provider(dmi_dir: Path = DMI_DIR) -> str | None:
    """Return the cloud provider named by local DMI strings, or None."""
    texts = []
    for name in ("sys_vendor", "product_name", "bios_vendor", "board_vendor", "chassis_asset_tag"):
        try:
            texts.append((dmi_dir / name).read_text(errors="replace").strip().lower())
        except OSError:
            continue
    blob = " ".join(texts)
    for marker, provider in _CLOUD_MARKERS.items():
        if marker in blob:
            return provider
    return None


def build_resource(service_name: str | None = None) -> Resource:
    """Resource for ckptprof spans; ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES`` win."""
    attrs: dict[str, str | int] = {
        "service.name": service_name or "ckptprof",
        "host.name": socket.gethostname(),
        "host.arch": platform.machine(),
        "os.type": platform.system().lower(),
        "process.pid": os.getpid(),
        "process.runtime.name": sys.implementation.name,
        "process.runtime.version": platform.python_version(),
    }
    provider = detect_cloud_provider()
    if provider:
        attrs["cloud.provider"] = provider
    # The standard variables win over what ckptprof detects.
    env = OTELResourceDetector().detect()
    resource = Resource.create(attrs).merge(env)
    if os.environ.get("OTEL_SERVICE_NAME"):
        resource = resource.merge(Resource({"service.name": os.environ["OTEL_SERVICE_NAME"]}))
    return resource
