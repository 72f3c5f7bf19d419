"""Multi-tenant agent orchestration service: the domain core (no Ray imports here)."""

from importlib.metadata import PackageNotFoundError, version

try:
    SERVICE_VERSION = version("orchestrator")
except PackageNotFoundError:  # running from a source tree that was not installed
    SERVICE_VERSION = "0.0.0+source"
