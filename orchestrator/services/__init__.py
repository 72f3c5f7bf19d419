"""The composition root: `build_services(settings, role, stack)` wires every service a process
uses, in one place, for each kind of process (the API replica and each actor kind).

Why one builder: the API replica used to fill a mutable context field by field during its
start, and each actor wired its own slice of the same services again (its own pools, stores,
gateway), so a constructor change meant editing seven places and a service's set-up could
differ between them. Here a role is a frozen dataclass of what that process uses: a `Core`
every role has (settings, the database, the event store, the process's metrics recorder)
plus the role's own services. The builder opens only what the role uses (an EventBus opens
no gateway; the heavy modules are imported inside the role that needs them, so an actor's
start-up cost stays its own), registers each close on `stack` as soon as it is open (a
build that fails halfway closes what it opened, in reverse), and returns the services built
completely: nothing is assigned after, and state that changes while serving (the Teams
verifier cache, the metrics pusher) lives in objects built here.

No Ray here: what reaches Ray actors (dispatchers, shard routers) is built by the caller and
handed in (`ApiPeers`), or built by the actor around the services it gets. The builder and the
core are in `_core`, the actors' roles in `_actors`, the API replica's in `_api` (which no
actor imports: its settings stay out of the actors' version).
"""

from orchestrator.services._actors import (
    AgentWorkerServices,
    ChannelHubServices,
    EventBusServices,
    InstanceServices,
    SchedulerServices,
    WorkflowShardServices,
)
from orchestrator.services._api import (
    ApiPeers,
    ApiServices,
    LocalMetricsHub,
    MetricsHub,
    WorkflowRunner,
)
from orchestrator.services._core import Core, build_services

__all__ = [
    "AgentWorkerServices",
    "ApiPeers",
    "ApiServices",
    "ChannelHubServices",
    "Core",
    "EventBusServices",
    "InstanceServices",
    "LocalMetricsHub",
    "MetricsHub",
    "SchedulerServices",
    "WorkflowRunner",
    "WorkflowShardServices",
    "build_services",
]
