"""Ray actors that host the domain services (named, in the `orchestrator` namespace)."""

NAMESPACE = "orchestrator"
