"""The model's turns: the request built from the session's conversation, the provider's answer
recorded with its usage and cost in one transaction, and what happens when the provider fails."""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from django.db import DatabaseError, transaction

from agents import eventlog, sandbox
from agents.eventlog import LeaseLost, NewEvent
from agents.models import EndReason, EventKind, PauseCause, Run, RunStatus
from agents.providers import pricing
from agents.providers.base import ProviderCrashed, ProviderError, Turn, TurnRequest
from agents.runtime import prompts
from agents.runtime.sessions import Sessions
from agents.runtime.slice import Slice, SliceOver, SliceResult

log = logging.getLogger(__name__)

# The system prompt and the tool schemas, in characters: part of every request's size.
STATIC_CHARS = len(prompts.SYSTEM_PROMPT) + sum(len(str(t)) for t in sandbox.TOOL_SCHEMAS)


def crashed(provider, error: Exception) -> ProviderCrashed:
    log.exception("the %s provider raised %s", getattr(provider, "name", "?"), type(error).__name__)
    return ProviderCrashed(
        f"the {getattr(provider, 'name', '')} provider failed: {type(error).__name__}: {error}"[
            :1000
        ]
    )


class Turns:
    def __init__(self, s: Slice, sessions: Sessions) -> None:
        self.s = s
        self.sessions = sessions

    def next(self) -> Turn:
        s, run = self.s, self.s.run
        request = TurnRequest(
            model=run.model,
            system=prompts.SYSTEM_PROMPT,
            messages=s.conv.request_messages(),
            tools=sandbox.TOOL_SCHEMAS,
            previous_meta=s.previous_meta,
            handoff_requested=s.conv.handoff_requested,
            input_chars=s.conv.chars + STATIC_CHARS,
            branch=run.branch_seq,
        )
        s.context_seq = s.known_seq
        try:
            return s.call_model(
                lambda: s.provider.next_turn(request),
                cancelled=self.sessions.stop_unless_running,
            )
        except (SliceOver, LeaseLost, DatabaseError):
            raise  # a busy database is not the model's failure: the slice is tried again
        except ProviderError as e:
            self.provider_failed(e)
        except Exception as e:
            self.provider_failed(crashed(s.provider, e))

    def provider_failed(self, e: ProviderError) -> NoReturn:
        """A model call failed for good: record it, then pause (resumable) or fail the run."""
        s = self.s
        s.append(
            s.event(
                EventKind.ERROR,
                {
                    "source": "provider",
                    "error": type(e).__name__,
                    "message": e.message,
                    "status_code": e.status_code,
                },
            )
        )
        if e.action == "fail":
            s.transition(RunStatus.FAILED, reason=e.message)
            self.sessions.end(EndReason.FAILED)
            raise SliceOver(SliceResult.FAILED) from e
        s.transition(RunStatus.PAUSED, reason=e.message, cause=PauseCause.PROVIDER)
        s.suspend_session()
        raise SliceOver(SliceResult.PAUSED) from e

    def record(
        self,
        turn: Turn,
        *,
        first_call: NewEvent | None = None,
        first_result: tuple[dict[str, Any], sandbox.ToolResult] | None = None,
        context_seq: int | None = None,
    ) -> None:
        """The turn, its usage and (when nothing stands in its way) its first call's tool.call,
        in one transaction with the run's and the session's counters; and with them the first
        call's result when that call only reads (`first_result`: its block and result; see
        `Calls.read_first`), so such a step is one transaction. `context_seq`: the log's seq
        its request saw, when the turn was not asked for here (an external agent's)."""
        s, usage = self.s, turn.usage
        if context_seq is not None:
            s.context_seq = context_seq
        priced = pricing.cost(turn.model, usage)
        cost = priced.usd
        payload = {
            "content": turn.content,
            "text": turn.text,
            "stop_reason": turn.stop_reason,
            "usage": usage.as_dict(),
            "cost_usd": str(cost),
            "price": priced.source,
            "model": turn.model,
            "latency_ms": round(turn.latency_ms, 2),
            "context_seq": s.context_seq,
            "meta": turn.meta,
        }
        new = [s.event(EventKind.MODEL_TURN, payload, actor="agent")]
        if first_call is not None:
            new.append(first_call)
        if first_result is not None:
            new.append(s.result_event(*first_result))
        increments = {
            "turns": 1,
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "cache_read_tokens": usage.cache_read_input_tokens,
            "cache_write_tokens": usage.cache_creation_input_tokens,
            "cost_usd": cost,
        }
        context_tokens = (
            usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens
        )
        with transaction.atomic():
            appended = eventlog.append_many(
                s.run_id,
                new,
                lease_owner=s.owner,
                increments=increments,
                session_usage=(s.session.pk, context_tokens),
            )
            if priced.source == "fallback" and not s.run.cost_estimated:
                Run.objects.filter(pk=s.run_id).update(cost_estimated=True)
                s.run.cost_estimated = True
        for name, value in increments.items():
            setattr(s.run, name, getattr(s.run, name) + value)
            setattr(s.session, name, getattr(s.session, name) + value)
        s.session.last_input_tokens = context_tokens
        self.sessions.turn_taken(turn.meta)
        s.conv.add_assistant(turn.content, context_seq=s.context_seq)
        if first_call is not None:
            s.conv.add_tool_call(first_call.payload["tool_use_id"])
        if first_result is not None:
            s.add_result(*first_result, appended.events[2])
        s.absorb(appended)
