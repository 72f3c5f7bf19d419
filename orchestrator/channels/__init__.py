"""Channels: messaging-platform integrations (Slack-style, Teams-style, Telegram-style,
generic webhook): verification of inbound deliveries, platform formats, the channel store
and inbox, and the relay that answers messages with agent tasks and delivers the answers;
interventions' questions with Approve/Reject buttons, and the presses that decide them
(issue 32)."""

from orchestrator.channels._approvals import Answer, InterventionDesk, InterventionPoster
from orchestrator.channels._asks import ask_missing
from orchestrator.channels._config import CHANNEL_TYPES, validate_config
from orchestrator.channels._interactive import (
    Press,
    parse_slack_action,
    parse_teams_action,
    parse_telegram_callback,
)
from orchestrator.channels._limits import InboundLimits
from orchestrator.channels._platforms import (
    Challenge,
    DeliveryFailed,
    Inbound,
    parse_slack,
    parse_teams,
    parse_telegram,
    parse_webhook,
    send_slack,
    send_teams,
    send_telegram,
    send_webhook,
    telegram_chat_allowed,
)
from orchestrator.channels._posts import PostStore
from orchestrator.channels._relay import ChannelRelay, ChannelRunner, LocalChannels, reply_of
from orchestrator.channels._store import (
    NO_AUDIENCE,
    Channel,
    ChannelStore,
    InboxItem,
    channel_shard,
)
from orchestrator.channels._verify import (
    TeamsVerifier,
    TeamsVerifiers,
    VerificationFailed,
    teams_channel_id,
    verify_slack,
    verify_teams_service_url,
    verify_telegram,
)
from orchestrator.egress import (
    DestinationNotAllowed,
    EgressPolicy,
    channel_egress,
    egress_client,
)
from orchestrator.secret_box import secret_box

__all__ = [
    "CHANNEL_TYPES",
    "NO_AUDIENCE",
    "Answer",
    "Challenge",
    "Channel",
    "ChannelRelay",
    "ChannelRunner",
    "ChannelStore",
    "DeliveryFailed",
    "DestinationNotAllowed",
    "EgressPolicy",
    "Inbound",
    "InboundLimits",
    "InboxItem",
    "InterventionDesk",
    "InterventionPoster",
    "LocalChannels",
    "PostStore",
    "Press",
    "TeamsVerifier",
    "TeamsVerifiers",
    "VerificationFailed",
    "ask_missing",
    "channel_egress",
    "channel_shard",
    "egress_client",
    "parse_slack",
    "parse_slack_action",
    "parse_teams",
    "parse_teams_action",
    "parse_telegram",
    "parse_telegram_callback",
    "parse_webhook",
    "reply_of",
    "secret_box",
    "send_slack",
    "send_teams",
    "send_telegram",
    "send_webhook",
    "teams_channel_id",
    "telegram_chat_allowed",
    "validate_config",
    "verify_slack",
    "verify_teams_service_url",
    "verify_telegram",
]
