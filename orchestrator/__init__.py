"""Multi-tenant agent orchestration service: the domain core (no Ray imports here)."""
