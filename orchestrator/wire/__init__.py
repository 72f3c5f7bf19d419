"""The API's wire models: every request and answer body the server and the SDK share,
defined once (SPEC parts 2 and 4, DESIGN).

The routers (deployments/routers) declare their responses with these models and the SDK
(orchestrator.sdk) reads answers into them, so the two cannot drift. This package imports
nothing but pydantic, the standard library and its own modules (tests/unit/test_wire.py
checks it): the SDK installs without FastAPI or the service's dependencies. One module per
part of the API, each exporting its models; this package exports them all. The in-cluster
SDK's envelope (`HandleRequest`, `HandleResponse`) is in orchestrator.wire.handle.
"""

from orchestrator.wire import (
    _base,
    channels,
    chat,
    events,
    inference,
    interventions,
    marketplace,
    memory,
    operations,
    schedules,
    teams,
    tokens,
    tools,
    workflows,
    workspace,
)
from orchestrator.wire._base import *  # noqa: F403
from orchestrator.wire.channels import *  # noqa: F403
from orchestrator.wire.chat import *  # noqa: F403
from orchestrator.wire.events import *  # noqa: F403
from orchestrator.wire.inference import *  # noqa: F403
from orchestrator.wire.interventions import *  # noqa: F403
from orchestrator.wire.marketplace import *  # noqa: F403
from orchestrator.wire.memory import *  # noqa: F403
from orchestrator.wire.operations import *  # noqa: F403
from orchestrator.wire.schedules import *  # noqa: F403
from orchestrator.wire.teams import *  # noqa: F403
from orchestrator.wire.tokens import *  # noqa: F403
from orchestrator.wire.tools import *  # noqa: F403
from orchestrator.wire.workflows import *  # noqa: F403
from orchestrator.wire.workspace import *  # noqa: F403

__all__: list[str] = []
__all__ += _base.__all__
__all__ += operations.__all__
__all__ += tokens.__all__
__all__ += workflows.__all__
__all__ += interventions.__all__
__all__ += teams.__all__
__all__ += schedules.__all__
__all__ += events.__all__
__all__ += inference.__all__
__all__ += chat.__all__
__all__ += channels.__all__
__all__ += marketplace.__all__
__all__ += memory.__all__
__all__ += workspace.__all__
__all__ += tools.__all__
