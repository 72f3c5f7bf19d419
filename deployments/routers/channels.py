"""SPEC part 4, channels: CRUD (tenant-scoped, secrets never shown after creation) and the
webhook receiver, which verifies a delivery by its channel's type, writes the message to the
inbox (once per platform delivery id) and answers at once; a ChannelHub (or the in-process
relay) answers it with an agent task run as the channel's owner and delivers the answer.

Issue 32: the same receiver takes the presses of an intervention's Approve/Reject buttons
(Slack's form-encoded interactions, Telegram callback queries, Teams card submits), verified
like every delivery of their channel, and decides for a listed approver; a generic
webhook's signed links are GET (a confirmation form only: link scanners prefetch GETs) and
POST (decides) under /channels/webhook/decide/{token}."""

from __future__ import annotations

import html
import json
import logging
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from deployments.client_address import scope_client_address
from deployments.deps import (
    ChannelDesk,
    ChannelDriver,
    ChannelLimits,
    Channels,
    Config,
    CurrentUser,
    TeamsVerifierCache,
)
from orchestrator import wire
from orchestrator.channels import (
    NO_AUDIENCE,
    Challenge,
    Channel,
    ChannelStore,
    Inbound,
    InterventionDesk,
    Press,
    TeamsVerifier,
    TeamsVerifiers,
    VerificationFailed,
    parse_slack,
    parse_slack_action,
    parse_teams,
    parse_teams_action,
    parse_telegram,
    parse_telegram_callback,
    parse_webhook,
    reply_of,
    teams_channel_id,
    verify_slack,
    verify_teams_service_url,
    verify_telegram,
)
from orchestrator.config import Settings
from orchestrator.errors import NotFound, ServiceUnavailable, ValidationFailed
from orchestrator.interventions import LinkExpired, LinkRefused

log = logging.getLogger(__name__)

router = APIRouter(tags=["channels"])


def _channel_id(
    channel_id: Annotated[str, Path(max_length=200, description="Channel id (`ch-<n>`)")],
) -> str:
    # An id that names nothing is a 404 whatever its shape (SPEC part 7: channel not found).
    if not re.fullmatch(r"ch-\d{1,18}", channel_id):
        raise NotFound("channel not found")
    return channel_id


ChannelId = Annotated[str, Depends(_channel_id)]


class CreateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Any = Field(description="slack, teams, telegram or webhook (others: 422)")
    name: Any = Field(description="1-200 characters")
    config: Any = Field(default_factory=dict)


class UpdateBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Any = None
    config: Any = Field(None, description="Merged into the current config; null removes a key")
    status: Any = Field(None, description="active or paused")
    rotate_token: bool = False


MAX_INBOUND_TEXT = 20_000


def _clean(value: Any) -> Any:
    """Without NUL characters (Postgres text and jsonb refuse them), at any depth."""
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _path(token: str) -> str:
    return f"/api/v1/channels/webhook/{token}"


def _shown(channel: Channel, settings: Settings) -> dict[str, Any]:
    """As a read shows it: secrets masked, `webhook_url` as set (SPEC part 4) unless
    `channel_mask_webhook_url`."""
    return channel.wire(mask_webhook_url=settings.channel_mask_webhook_url)


@router.get("/channels", response_model=wire.ChannelList)
async def list_channels(store: Channels, caller: CurrentUser, settings: Config) -> wire.ChannelList:
    """The caller's channels (an admin's: every channel)."""
    channels = await store.list_for(caller)
    return wire.ChannelList(data=[wire.Channel(**_shown(c, settings)) for c in channels])


@router.post("/channels", response_model=wire.ChannelCreated)
async def create_channel(
    body: CreateBody, channels: Channels, caller: CurrentUser, settings: Config
) -> wire.ChannelCreated:
    """Config by type: slack `signing_secret` and `webhook_url` (or `bot_token`); teams
    `webhook_url`, `tenant_id` (`app_id`); telegram `bot_token`, `chat_ids`
    (`secret_token`); webhook (`callback_url`). 400 names a bad field; 422 an unknown type."""
    channel, token = await channels.create(caller, body.type, body.name, body.config)
    return wire.ChannelCreated(
        data=wire.CreatedChannel(
            **_shown(channel, settings), webhook_token=token, webhook_path=_path(token)
        )
    )


@router.get("/channels/{channel_id}", response_model=wire.Channel)
async def get_channel(
    channel_id: ChannelId, channels: Channels, caller: CurrentUser, settings: Config
) -> wire.Channel:
    return wire.Channel(**_shown(await channels.get(channel_id, caller), settings))


@router.put("/channels/{channel_id}", response_model=wire.ChannelUpdated)
async def update_channel(
    body: UpdateBody,
    channel_id: ChannelId,
    channels: Channels,
    caller: CurrentUser,
    settings: Config,
) -> wire.ChannelUpdated:
    channel, token = await channels.update(
        channel_id,
        caller,
        name=body.name,
        config=body.config,
        status=body.status,
        rotate_token=body.rotate_token,
    )
    return wire.ChannelUpdated(
        data=wire.Channel(**_shown(channel, settings)),
        webhook_token=token,
        webhook_path=_path(token) if token else None,
    )


@router.delete("/channels/{channel_id}", response_model=wire.ChannelDeleted)
async def delete_channel(
    channel_id: ChannelId, channels: Channels, caller: CurrentUser
) -> wire.ChannelDeleted:
    await channels.delete(channel_id, caller)
    return wire.ChannelDeleted(deleted=channel_id)


# --- the receiver ----------------------------------------------------------------------------


def _json_body(raw: bytes) -> Any:
    try:
        return json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValidationFailed("body: not JSON") from exc


async def _teams_verifier(
    s: Settings, verifiers: TeamsVerifiers, channel: Channel, channels: ChannelStore
) -> TeamsVerifier:
    audience = channel.config.get("app_id") or s.teams_audience
    if not audience:
        # Created without one (the spec's config has none): refused, and said on the channel.
        await channels.inbound_refused(channel.id, NO_AUDIENCE)
        raise VerificationFailed("teams channel has no app_id (the token audience) to check")
    return verifiers.for_audience(audience)


@router.post(
    "/channels/webhook/{token}",
    response_model=wire.WebhookAck,
    responses={
        401: {"description": "verification failed"},
        404: {"description": "no channel"},
        429: {
            "description": "the channel's or its owner's inbound messages per minute "
            "(channel_inbound_per_minute, channel_inbound_per_owner_per_minute); Retry-After"
        },
    },
)
async def receive(
    request: Request,
    channels: Channels,
    settings: Config,
    channel_limits: ChannelLimits,
    channel_runner: ChannelDriver,
    teams_verifiers: TeamsVerifierCache,
    desk: ChannelDesk,
    token: Annotated[str, Path(min_length=8, max_length=200)],
    sync: Annotated[
        bool, Query(description="Generic webhooks: wait and answer in the response")
    ] = False,
) -> Response:
    """A platform's delivery: verified by the channel's type (Slack v0 signature, Teams JWT,
    Telegram source IP and secret token, generic: the token), then accepted at once. 401 and
    nothing relayed when verification fails; duplicates (a platform's retries) are accepted
    and not relayed again. 429 with Retry-After, nothing relayed, past the channel's or its
    owner's inbound messages per minute."""
    channel = await channels.by_token(token)
    if channel is None:
        raise NotFound("channel not found")
    raw = await request.body()
    headers = {k.lower(): v for k, v in request.headers.items()}
    s = settings
    inbound: Inbound | Challenge | None
    if channel.type == "slack":
        verify_slack(channel.secrets.get("signing_secret", ""), headers, raw)
        if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
            # An interaction (the Interactivity Request URL is this receiver): acknowledged
            # at once with an empty 200, as Slack wants within 3 s.
            press = parse_slack_action(raw)
            if press is not None:
                told = await desk.decide_from_channel(channel, press)
                if not told.decided:
                    desk.tell_slack(press.reply.get("response_url"), told.text)
            return Response(status_code=200)
        inbound = parse_slack(_json_body(raw))
        if isinstance(inbound, Challenge):
            return PlainTextResponse(inbound.challenge)
    elif channel.type == "teams":
        verifier = await _teams_verifier(s, teams_verifiers, channel, channels)
        claims = await verifier.verify(headers.get("authorization"), teams_channel_id(raw))
        if channel.last_error == NO_AUDIENCE:
            # Verified against an audience set since (teams_audience, a restart): not refused.
            await channels.inbound_verified(channel.id, NO_AUDIENCE)
        body = _json_body(raw)
        press = parse_teams_action(body)
        if press is not None:
            return await _teams_press(desk, channel, claims, press)
        inbound = parse_teams(body)
        if inbound is not None:
            verify_teams_service_url(claims, inbound.reply.get("service_url"))
            tenant = inbound.metadata.get("tenant_id")
            if tenant != channel.config.get("tenant_id"):
                raise VerificationFailed("teams activity: from another tenant than the channel's")
    elif channel.type == "telegram":
        verify_telegram(
            scope_client_address(request.scope, s.trusted_proxies),
            s.telegram_allowed_cidrs,
            channel.secrets.get("secret_token"),
            headers,
        )
        update = _json_body(raw)
        press = parse_telegram_callback(update)
        if press is not None:
            # Answered in the webhook's response (Bot API: "making requests when getting
            # updates"): the person's client stops spinning, a refusal shows as an alert.
            told = await desk.decide_from_channel(channel, press)
            return JSONResponse(
                {
                    "method": "answerCallbackQuery",
                    "callback_query_id": press.reply["callback_query_id"],
                    "text": told.text[:200],
                    "show_alert": not told.decided,
                }
            )
        inbound = parse_telegram(update, channel.config.get("chat_ids") or None)
    else:
        inbound = parse_webhook(_json_body(raw))
    if inbound is None:
        return JSONResponse(wire.WebhookAck(accepted=False, ignored="not a message").model_dump())
    if channel.status == "paused":
        return JSONResponse(wire.WebhookAck(accepted=False, ignored="channel paused").model_dump())
    # Each message relayed runs an agent task as the owner, and no bearer token limits
    # these requests: the channel's and the owner's budgets do (after verification, so a
    # forger cannot spend them). Only a message newly enqueued costs: the inbox's unique
    # delivery id finds a platform's re-delivery, and its count is given back.
    admitted = await channel_limits.admit(channel)
    wait = sync and channel.type == "webhook"
    inbox_id: int | None = None
    try:
        inbox_id = await channels.enqueue(
            channel.id,
            delivery_id=_clean(inbound.delivery_id),
            conversation=_clean(inbound.conversation),
            text=_clean(inbound.text)[:MAX_INBOUND_TEXT],
            sender=_clean(inbound.user),
            reply=_clean(reply_of(inbound.reply, wait)),
        )
    finally:
        if inbox_id is None:
            channel_limits.refund(channel, admitted)
    if inbox_id is None:
        return JSONResponse(wire.WebhookAck(accepted=False, duplicate=True).model_dump())
    if wait:
        try:
            answer = await channel_runner.answer(channel.id, inbox_id, s.channel_sync_timeout_s)
        except TimeoutError as exc:
            raise ServiceUnavailable("no answer in time; it is still being worked on") from exc
        return JSONResponse(wire.WebhookAck(accepted=True, answer=answer).model_dump())
    await channel_runner.submit(channel.id, inbox_id)
    return JSONResponse(wire.WebhookAck(accepted=True).model_dump())


async def _teams_press(
    desk: InterventionDesk, channel: Channel, claims: dict[str, Any], press: Press
) -> Response:
    """A card's submit, checked as any Teams activity (the token's serviceurl, the tenant);
    an invoke is answered with the outcome (Universal Actions' message response)."""
    verify_teams_service_url(claims, press.reply.get("service_url"))
    if press.reply.get("tenant_id") != channel.config.get("tenant_id"):
        raise VerificationFailed("teams activity: from another tenant than the channel's")
    answer = await desk.decide_from_channel(channel, press)
    if not answer.decided and not press.reply.get("invoke"):
        desk.tell_teams(channel, press, answer.text)
    if press.reply.get("invoke"):
        return JSONResponse(
            {
                "statusCode": 200,
                "type": "application/vnd.microsoft.activity.message",
                "value": answer.text,
            }
        )
    return JSONResponse(wire.WebhookAck(accepted=answer.decided).model_dump())


# --- a generic webhook's signed decision links ------------------------------------------------

DecisionToken = Annotated[str, Path(min_length=20, max_length=600)]


# A person's link, not an API call: documented in docs/api/channels.md, left out of the
# OpenAPI document (and so of the SDK).
@router.get(
    "/channels/webhook/decide/{token}",
    include_in_schema=False,
    response_class=HTMLResponse,
    responses={
        401: {"description": "not a valid link (changed, another key)"},
        410: {"description": "the link expired"},
    },
)
async def confirm_decision(token: DecisionToken, desk: ChannelDesk) -> HTMLResponse:
    """A confirmation page with one button that POSTs the decision: a GET never decides
    (mail scanners and link unfurlers fetch links before a person clicks)."""
    link = desk.signer.verify(token)
    verb = "Approve" if link.approve else "Reject"
    iv, who = html.escape(link.intervention_id), html.escape(link.approver)
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<meta name='robots' content='noindex'><title>{verb} {iv}</title></head><body>"
        f"<p>{verb} intervention <b>{iv}</b> as <b>{who}</b>?</p>"
        f"<form method='post'><button type='submit'>{verb}</button></form></body></html>"
    )
    return HTMLResponse(page, headers={"cache-control": "no-store"})


@router.post(
    "/channels/webhook/decide/{token}",
    include_in_schema=False,
    response_model=wire.InterventionDecided,
    responses={
        401: {"description": "not a valid link (changed, another key)"},
        403: {"description": "the link's approver is no longer listed by the channel"},
        404: {"description": "no such intervention on a webhook channel"},
        409: {"description": "already decided (`status`, `decided_by`)"},
        410: {"description": "the link expired"},
    },
)
async def decide_by_link(token: DecisionToken, desk: ChannelDesk) -> wire.InterventionDecided:
    """Decide as the link says, once: its second use (or any decision first) is a 409."""
    try:
        link = desk.signer.verify(token)
    except (LinkRefused, LinkExpired):
        log.info("a decision link was refused")
        raise
    decided = await desk.decide_link(link)
    iv = decided.intervention
    return wire.InterventionDecided(id=iv.id, status=iv.status)  # type: ignore[arg-type]
