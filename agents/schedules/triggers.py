"""Triggers: an inbound webhook (`POST /hooks/<token>/`) that makes a run from a template run,
with the request's JSON put into the goal through `{payload.path}` places.

The token is long and random, shown once, and stored only as its SHA-256; a trigger with a secret
also needs an HMAC-SHA256 signature of the body (`X-Shiftlog-Signature: sha256=HEX`, or GitHub's
`X-Hub-Signature-256`). Both are compared in constant time (hmac.compare_digest). A delivery id
(`X-Delivery-Id`, `X-GitHub-Delivery` or Standard Webhooks' `webhook-id`) seen before by the same
trigger makes nothing: one unique row per (trigger, id).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from django.db import IntegrityError, transaction
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone

from agents import inputs, services
from agents.models import Run, Trigger, TriggerDelivery
from agents.schedules import cron as schedules

TOKEN_BYTES = 32
SIGNATURE_HEADERS = ("X-Shiftlog-Signature", "X-Hub-Signature-256")
DELIVERY_HEADERS = ("X-Delivery-Id", "X-GitHub-Delivery", "webhook-id")
MAX_VALUE_CHARS = 2000  # one inserted value, at most
PLACE = re.compile(r"\{payload((?:\.[A-Za-z0-9_\-]+)*)\}")


class TriggerError(schedules.ScheduleError):
    pass


@dataclass
class Delivered:
    """What a delivery did: the status to answer with and what to say."""

    status: int
    message: str
    run: Run | None = None


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def create(
    template: Run, *, secret: str = "", goal: str = "", created_by=None
) -> tuple[Trigger, str]:
    """A new trigger and its token (shown once: only its hash is kept)."""
    secret = inputs.text(
        secret, what="the secret", max_length=200, required=False, field="secret"
    ).strip()
    if secret and len(secret) < 16:
        raise TriggerError("a secret needs at least 16 characters", "secret")
    goal = inputs.text(goal, what="the goal", required=False, field="goal")
    if goal:
        check_places(goal)
    token = secrets.token_urlsafe(TOKEN_BYTES)
    trigger = Trigger.objects.create(
        template=template,
        token_hash=hash_token(token),
        token_prefix=token[:6],
        secret=secret,
        goal=goal,
        created_by=created_by,
    )
    return trigger, token


def get(trigger_id: Any) -> Trigger:
    try:
        return Trigger.objects.select_related("template").get(
            pk=inputs.object_id(trigger_id, what="a trigger id")
        )
    except (Trigger.DoesNotExist, inputs.InputError):
        raise TriggerError(f"no trigger with id {trigger_id}") from None


def revoke(trigger_id: int) -> Trigger:
    trigger = get(trigger_id)
    if trigger.revoked_at is not None:
        raise TriggerError(f"trigger {trigger_id} is already revoked")
    Trigger.objects.filter(pk=trigger.pk).update(revoked_at=timezone.now())
    return get(trigger_id)


def find(token: str) -> Trigger | None:
    """The live trigger whose token this is. The lookup is by the token's SHA-256 (an index
    cannot leak how much of a guess was right), and the hash is then compared in constant time,
    against a stand-in when nothing matched, so a miss takes the same steps as a hit."""
    wanted = hash_token(token)
    trigger = Trigger.objects.filter(token_hash=wanted, revoked_at__isnull=True).first()
    stored = trigger.token_hash if trigger is not None else "0" * 64
    if not hmac.compare_digest(stored, wanted) or trigger is None:
        return None
    return trigger


def signature_ok(trigger: Trigger, body: bytes, headers) -> bool:
    if not trigger.secret:
        return True
    expected = hmac.new(trigger.secret.encode(), body, hashlib.sha256).hexdigest()
    for name in SIGNATURE_HEADERS:
        given = (headers.get(name) or "").strip()
        if given:
            given = given.removeprefix("sha256=")
            return hmac.compare_digest(given.lower().encode(), expected.encode())
    return False


def delivery_id(headers) -> str:
    for name in DELIVERY_HEADERS:
        value = (headers.get(name) or "").strip()
        if value:
            return value[:200]
    return ""


# --- the goal's places -----------------------------------------------------------------------
def check_places(goal: str) -> None:
    """A goal's `{payload…}` places must be well formed: `{payload}` or `{payload.a.0.b}`."""
    for opened in re.finditer(r"\{payload", goal):
        if not PLACE.match(goal, opened.start()):
            end = goal.find("}", opened.start())
            bad = goal[opened.start() : end + 1 if end >= 0 else opened.start() + 40]
            raise TriggerError(
                f"{bad!r} is not a place: write {{payload.path.to.value}} (letters, digits, _ "
                "and - between dots; list items by number)",
                "goal",
            )


def lookup(payload: Any, path: str) -> Any:
    """The value at a dotted path (list items by index); KeyError naming the path if absent."""
    value = payload
    for part in [p for p in path.split(".") if p]:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(f"payload{path}")
    return value


def fill(goal: str, payload: Any) -> str:
    """The goal with each place replaced by its value as text (strings as they are, anything
    else as JSON), each cut at MAX_VALUE_CHARS. Nothing is evaluated; a value's own braces are
    never read as places (one pass over the template)."""

    def value_of(match: re.Match) -> str:
        value = lookup(payload, match.group(1))
        text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
        return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS] + "…"

    return PLACE.sub(value_of, goal)


# --- a delivery ------------------------------------------------------------------------------
def deliver(trigger: Trigger, body: bytes, headers) -> Delivered:
    """Act on a delivery whose token matched: signature, replay, payload, then the run."""
    if not signature_ok(trigger, body, headers):
        return Delivered(401, "bad or missing signature (X-Shiftlog-Signature: sha256=HEX)")
    try:
        payload = json.loads(body.decode("utf-8")) if body.strip() else {}
    except (UnicodeDecodeError, ValueError):
        return Delivered(400, "the body is not JSON")
    template = trigger.goal or trigger.template.goal
    try:
        goal = fill(template, payload)
    except KeyError as e:
        return Delivered(422, f"the payload has no {e.args[0]} (the goal needs it)")
    seen = delivery_id(headers)
    try:
        with transaction.atomic():
            if seen:
                delivery = TriggerDelivery.objects.create(trigger=trigger, delivery_id=seen)
            run = schedules.run_from_template(
                trigger.template,
                goal=goal,
                actor=f"trigger:{trigger.pk}",
                created_by=trigger.created_by,
                trigger=trigger,
            )
            if seen:
                TriggerDelivery.objects.filter(pk=delivery.pk).update(run=run)
            Trigger.objects.filter(pk=trigger.pk).update(last_delivery_at=timezone.now())
    except IntegrityError:
        return Delivered(200, f"delivery {seen!r} was already delivered: nothing done")
    except services.RunError as e:
        return Delivered(422, f"no run was made: {e}")
    return Delivered(201, f"run {run.pk} created", run)


def url_for(request: HttpRequest, token: str) -> str:
    """The trigger's webhook address, as the person creating it is shown it once."""
    return request.build_absolute_uri(reverse("hook", args=[token]))
