"""An approval's whole life: requested by the runtime, decided by a person (or expired, or
discarded by a rewind), each step an `approval.*` event.

- **request**: every call of a turn that needs a person becomes an Approval row and an
  `approval.requested` event at once, and the run's webhooks hear of it.
- **decide**: one conditional UPDATE on a pending approval, so when two people decide at once
  exactly one wins and the other is told who was first. When the last pending approval of a run
  is decided, the run goes back to the queue; no worker waited meanwhile.
- **expire**: a pending approval past its expiry counts as denied; its run pauses.
- **discard**: a rewind discards the pending approvals of the branch it abandons, and a run's
  end (cancelled, failed, succeeded; `lifecycle.transition`) discards all of its own
  (agents/approval_endings.py). A decision on an ended run is refused, saying why.

Every ending writes `approval.decided` with the same payload (`decided_payload`), so the inbox,
the header's count and the log always agree.
"""

from __future__ import annotations

import contextlib
import difflib
import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents import (
    config_changes,
    eventlog,
    hooks,
    inputs,
    lifecycle,
    notifications,
    policy,
    reach,
    sandbox,
    services,
)
from agents.approval_endings import (  # noqa: F401 (discard_*: part of this module's surface)
    decided_payload,
    discard_of_ended_runs,
    discard_pending,
)
from agents.eventlog import NewEvent
from agents.jobs import enqueue
from agents.models import (
    Approval,
    ApprovalStatus,
    ApprovalSubject,
    Event,
    EventKind,
    ExternalCall,
    PauseCause,
    Run,
    RunStatus,
)


class ApprovalError(ValueError):
    pass


class NotAllowed(ApprovalError):
    pass


class RunEnded(ApprovalError):
    """The approval's run has ended: nothing it asked can be decided any more (a conflict)."""


def can_decide(user) -> bool:
    return user is not None and user.is_active and user.has_perm("agents.decide_approval")


# --- request --------------------------------------------------------------------------------
def flood(run: Run, asking: int) -> str:
    """Why asking a person about `asking` more calls now would flood the inbox, or "".

    One command (a turn's calls, or a command's new hosts) asks about at most
    APPROVALS_PER_COMMAND at once, and a run about at most APPROVALS_PER_RUN since a person last
    resumed it: past either the caller asks nothing, tells the agent, and pauses the run with
    this as its reason (a person resuming it starts the run's count again)."""
    per_command = settings.SHIFTLOG["APPROVALS_PER_COMMAND"]
    if per_command and asking > per_command:
        return (
            f"one command asked for {asking} approvals at once (at most {per_command}, "
            "SHIFTLOG_APPROVALS_PER_COMMAND); none were asked. Look at what the run is doing, "
            "add rules for what it may do, then resume it"
        )
    per_run = settings.SHIFTLOG["APPROVALS_PER_RUN"]
    if not per_run:
        return ""
    since = (
        Event.objects.filter(
            run_id=run.pk, kind=EventKind.RUN_STATUS, payload__from=RunStatus.PAUSED
        )
        .order_by("-seq")
        .values_list("seq", flat=True)
        .first()
    ) or 0
    asked = Approval.objects.filter(run_id=run.pk, seq__gt=since).count()
    if asked + asking > per_run:
        return (
            f"the run asked for {asked + asking} approvals since it was last resumed (at most "
            f"{per_run}, SHIFTLOG_APPROVALS_PER_RUN); these {asking} were not asked. Look at "
            "what the run is doing, add rules for what it may do, then resume it"
        )
    return ""


def request(
    run: Run,
    calls: list[tuple[str, str, dict[str, Any], str]],
    *,
    session_id: int,
    seq: int,
    actor: str,
    lease_owner: str,
    subject: str = ApprovalSubject.TOOL_CALL,
) -> tuple[dict[str, Approval], eventlog.Appended]:
    """Ask a person about these calls, (tool_use_id, tool, validated input, why) each: one
    Approval per call (again for a call asked about before: the same row), one event each.
    `subject` says what they are about (a tool call, a network host, a merge conflict)."""
    timeout = run.approval_timeout_seconds or settings.SHIFTLOG["APPROVAL_TIMEOUT_SECONDS"]
    expires = timezone.now() + timedelta(seconds=timeout) if timeout else None
    created: dict[str, Approval] = {}
    events = []
    with transaction.atomic():
        for tool_use_id, tool, tool_input, why in calls:
            approval, _ = Approval.objects.get_or_create(
                run_id=run.pk,
                tool_use_id=tool_use_id,
                defaults={
                    "session_id": session_id,
                    "seq": seq,
                    "tool_name": tool,
                    "tool_input": tool_input,
                    "subject": subject,
                    "expires_at": expires,
                },
            )
            created[tool_use_id] = approval
            events.append(
                NewEvent(
                    EventKind.APPROVAL_REQUESTED,
                    {
                        "approval_id": approval.pk,
                        "tool_use_id": tool_use_id,
                        "tool": approval.tool_name,
                        "input": approval.tool_input,
                        "reason": why,
                        "expires_at": approval.expires_at.isoformat()
                        if approval.expires_at
                        else None,
                    },
                    session_id=session_id,
                    actor=actor,
                )
            )
        appended = eventlog.append_many(run.pk, events, lease_owner=lease_owner)
        reach.approvals_asked(run, list(created.values()))
        notifications.notify(
            run,
            "approval.requested",
            approvals=[
                {"id": a.pk, "tool": a.tool_name, "input": a.tool_input} for a in created.values()
            ],
        )
    return created, appended


# --- decide ---------------------------------------------------------------------------------
def input_diff(tool: str, before: dict[str, Any], after: dict[str, Any]) -> str:
    """A readable diff of an edit: the command for bash, the JSON for everything else."""
    if policy.canonical_name(tool) == "bash":  # also another agent's "Bash"
        a, b = str(before.get("command", "")), str(after.get("command", ""))
    else:
        a = json.dumps(before, indent=2, sort_keys=True)
        b = json.dumps(after, indent=2, sort_keys=True)
    lines = difflib.unified_diff(
        a.splitlines() or [""], b.splitlines() or [""], "requested", "approved", lineterm=""
    )
    return "\n".join(lines) + "\n"


# The words for a decision, the same in the web form, the API, the CLI and the docs:
#   decision       approve | edit | deny
#   reason         what the person says: a denial needs one (the agent reads it); an approval's
#                  is passed on as their comment
#   input          an edit's whole new input (a JSON object, or its text)
#   allow_similar  with approve: also allow similar calls for the rest of the run (for a network
#                  host: the host, for the rest of the run)
DECISIONS = ("approve", "edit", "deny")


def decide_as(
    approval_id: int,
    *,
    user,
    decision: str,
    reason: str = "",
    input: Any = None,
    allow_similar: bool = False,
) -> Approval:
    """A decision in the one vocabulary above, from whichever surface a person used."""
    if decision not in DECISIONS:
        raise ApprovalError(f"decision must be one of {', '.join(DECISIONS)}, not {decision!r}")
    edited = None
    if decision == "edit":
        if input is None or input == "":
            raise ApprovalError("input: an edit needs the whole edited input")
        edited = parse_edit(get(approval_id), input) if isinstance(input, str) else input
    elif input is not None and input != "":
        raise ApprovalError("input: only an edit takes an input (decision: edit)")
    return decide(
        approval_id,
        user=user,
        approve=decision != "deny",
        edited_input=edited,
        comment=reason,
        allow_similar=allow_similar,
    )


def parse_edit(approval: Approval, raw: str) -> dict[str, Any]:
    """The edited input a person gives, in one format wherever they give it (the web's edit box,
    `approve --input`, the API): the tool's input as a JSON object, e.g. {"command": "ls"} for
    bash. Raises ApprovalError saying what is wrong; nothing runs."""
    example = json.dumps(approval.tool_input)[:200]
    try:
        value = inputs.load_json((raw or "").strip(), what="the edited input")
    except inputs.InputError as e:
        raise ApprovalError(
            f"{e}; give the tool's input as a JSON object, e.g. {example}"
        ) from None
    if not isinstance(value, dict):
        raise ApprovalError(
            f"the edited input must be a JSON object (the tool's input), e.g. {example}"
        )
    return value


def get(approval_id: int) -> Approval:
    try:
        approval_id = inputs.object_id(approval_id, what="an approval id")
        return Approval.objects.select_related("run", "decided_by").get(pk=approval_id)
    except (Approval.DoesNotExist, inputs.InputError):
        raise ApprovalError(f"no approval with id {approval_id}") from None


def _refused(approval: Approval) -> ApprovalError:
    approval.refresh_from_db()
    who = approval.decided_by.get_username() if approval.decided_by else "nobody"
    when = approval.decided_at.strftime("%Y-%m-%d %H:%M:%S UTC") if approval.decided_at else ""
    if approval.status == ApprovalStatus.EXPIRED:
        return ApprovalError(
            f"approval {approval.pk} expired at {when}; it can no longer be decided"
        )
    if approval.status == ApprovalStatus.DISCARDED:
        return ApprovalError(
            f"approval {approval.pk} was discarded at {when} ({approval.comment}); "
            "it can no longer be decided"
        )
    return ApprovalError(f"approval {approval.pk} was already {approval.status} by {who} at {when}")


def closed_words(approval: Approval) -> str:
    """Why this approval can no longer be decided: who decided it and when, or that it expired
    or was discarded."""
    return str(_refused(approval))


def edit_refusal(approval: Approval) -> str:
    """Why this approval cannot be approved with an edited input, or "" when it can (every
    surface that offers an edit asks this one place)."""
    if approval.subject == ApprovalSubject.NETWORK_HOST:
        return "a network connection is allowed or denied, not edited"
    if approval.subject == ApprovalSubject.CONFIG_CHANGE:
        return (
            "a change to how the checks run is approved or denied, not edited (deny it "
            "with a reason saying what to change)"
        )
    return ""


def decide(
    approval_id: int,
    *,
    user,
    approve: bool,
    edited_input: dict[str, Any] | None = None,
    comment: str = "",
    allow_similar: bool = False,
) -> Approval:
    if not can_decide(user):
        raise NotAllowed(
            f"{user.get_username() if user else 'anonymous'} may not decide approvals (needs agents.decide_approval)"
        )
    approval = get(approval_id)
    try:
        comment = inputs.text(comment, what="the comment", max_length=5_000, required=False)
    except inputs.InputError as e:
        raise ApprovalError(str(e)) from None
    if not approve and not comment:
        raise ApprovalError("a denial needs a reason: the agent reads it")
    if edited_input is not None:
        if not approve:
            raise ApprovalError("an edit goes with an approval, not a denial")
        why_not = edit_refusal(approval)
        if why_not:
            raise ApprovalError(why_not)
        try:
            edited_input = _valid_edit(approval, edited_input)
        except sandbox.ToolInputError as e:
            raise ApprovalError(
                f"the edited input is not valid for {approval.tool_name}: {e}"
            ) from None
        if edited_input == approval.tool_input:
            edited_input = None
    if allow_similar and not approve:
        raise ApprovalError("allow-similar goes with an approval")
    if allow_similar and approval.subject == ApprovalSubject.CONFIG_CHANGE:
        raise ApprovalError(
            "allow-similar does not apply to a change to how the checks run: approve it alone"
        )
    status = ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED
    try:
        _decide(approval, user, status, comment, edited_input, allow_similar)
    except (services.RunError, lifecycle.IllegalTransition) as e:
        raise ApprovalError(str(e)) from None  # the state moved under the decision: a 4xx
    approval.refresh_from_db()
    return approval


def _decide(
    approval: Approval,
    user,
    status: str,
    comment: str,
    edited_input: dict[str, Any] | None,
    allow_similar: bool,
) -> None:
    approve = status == ApprovalStatus.APPROVED
    now = timezone.now()
    actor = f"user:{user.get_username()}"
    matched: list[int] = []
    with transaction.atomic():
        # The run row first, as the worker does before it starts waiting: the two serialise, so
        # a decision can never slip between the worker's last look and its going to sleep.
        run = Run.objects.select_for_update().get(pk=approval.run_id)
        if not run.is_live:
            approval.refresh_from_db()
            if approval.status != ApprovalStatus.PENDING:
                raise _refused(approval)  # who decided it says more than that the run ended
            raise RunEnded(
                f"run {run.pk} is {run.status}: approval {approval.pk} can no longer be "
                "decided (what a run asked ends with it)"
            )
        won = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
            status=status,
            decided_by=user,
            decided_at=now,
            comment=comment,
            edited_input=edited_input,
        )
        if not won:
            raise _refused(approval)
        reach.approval_settled([approval.pk])
        extra: dict[str, Any] = {}
        if approve and approval.subject == ApprovalSubject.CONFIG_CHANGE:
            # The approved content becomes what the checks use for those files (run state).
            extra["baseline"] = config_changes.apply(run, approval.tool_input)
        if edited_input is not None:
            extra = {
                "edited_input": edited_input,
                "diff": input_diff(approval.tool_name, approval.tool_input, edited_input),
            }
        eventlog.append(
            approval.run_id,
            EventKind.APPROVAL_DECIDED,
            decided_payload(approval, status, comment, **extra),
            actor=actor,
            session_id=approval.session_id,
        )
        if not approve and approval.subject == ApprovalSubject.NETWORK_HOST:
            # Denying a host denies it for the run: the agent is not asked about it again
            # (unless the run's policy is full: the denial stands, the host may be asked again).
            with contextlib.suppress(services.RunError):
                services.add_rule(
                    approval.run_id,
                    policy.network_rule(
                        str(approval.tool_input.get("host", "")),
                        approval.tool_input.get("port"),
                        "deny",
                    ),
                    actor=actor,
                    because=f"denied with approval {approval.pk}: {comment}",
                )
        if allow_similar:
            # Another agent's tool ("Bash") is read as ours first: the rule is as narrow.
            rule = policy.similar_rule(
                approval.tool_name, edited_input or approval.tool_input, root=_agent_root(approval)
            )
            try:
                services.add_rule(
                    approval.run_id,
                    rule,
                    actor=actor,
                    because=f"allow similar to approval {approval.pk}: {rule['note']}",
                )
            except services.RunError as e:
                # Nothing is decided: the person may approve without "similar".
                raise ApprovalError(f"{e}; approve this call alone instead") from None
            matched = _approve_matching(approval.run_id, user, actor)
        resume_if_all_decided(run, actor)
        # What follows from the decision, in its transaction (an external agent's call settled).
        hooks.decided(run, [approval.pk, *matched], actor)


def what_next(run_id: int) -> str:
    """What a decision left the run doing, in words ("run 7 continues" only when it does)."""
    run = Run.objects.get(pk=run_id)
    if run.status == RunStatus.QUEUED:
        return f"run {run_id} continues"
    if run.status == RunStatus.AWAITING_APPROVAL:
        left = Approval.objects.filter(run_id=run_id).pending().count()
        return f"run {run_id} still waits for {left} more decision(s)"
    if run.status == RunStatus.PAUSED:
        return f"run {run_id} is paused: resume it to go on"
    return f"run {run_id} is {run.get_status_display()}"


def _valid_edit(approval: Approval, edited: Any) -> dict[str, Any]:
    """An edit checked as the tool's input: against our tool's schema, or, for a tool of an
    external agent (which we do not know), as any JSON object."""
    if approval.tool_name in sandbox.TOOL_NAMES:
        return sandbox.validate_input(approval.tool_name, edited)
    if not isinstance(edited, dict):
        raise sandbox.ToolInputError("the input must be a JSON object")
    return edited


def _agent_root(approval: Approval) -> str | None:
    """An external agent's folder, as it declared it with the call (None for ours)."""
    return (
        ExternalCall.objects.filter(approval=approval).values_list("root", flat=True).first()
        or None
    )


def _approve_matching(run_id: int, user, actor: str) -> list[int]:
    """Pending calls that the run's policy now allows are approved along with the rule (their
    ids)."""
    run = Run.objects.get(pk=run_id)
    approved = []
    for other in Approval.objects.filter(run_id=run_id).pending():
        root = _agent_root(other)
        tool, tool_input = other.tool_name, other.tool_input
        if root or policy.canonical_name(tool) != tool:
            call = policy.agent_call(tool, tool_input, root=root)
            tool, tool_input = call.tool, call.input
        decision = policy.decide(
            run.tool_policy, tool, tool_input, workspace=root or run.workspace_path
        )
        if decision.action != "allow" or decision.rule is None:
            continue
        comment = f"allowed by {decision.reason}"
        if (
            Approval.objects.filter(pk=other.pk)
            .pending()
            .update(
                status=ApprovalStatus.APPROVED,
                decided_by=user,
                decided_at=timezone.now(),
                comment=comment,
            )
        ):
            reach.approval_settled([other.pk])
            eventlog.append(
                run_id,
                EventKind.APPROVAL_DECIDED,
                decided_payload(other, ApprovalStatus.APPROVED, comment),
                actor=actor,
                session_id=other.session_id,
            )
            approved.append(other.pk)
    return approved


def resume_if_all_decided(run: Run, actor: str) -> None:
    """Queue the run again once nothing of it waits for a person (`run` was read under its row
    lock, in this transaction: its status is current)."""
    if run.status != RunStatus.AWAITING_APPROVAL:
        return  # paused or cancelled meanwhile: a person resumes it explicitly
    if Approval.objects.filter(run_id=run.pk).pending().exists():
        return
    lifecycle.transition(
        run.pk, RunStatus.QUEUED, actor=actor, reason="every waiting tool call is decided"
    )
    enqueue(run.pk)


# --- expire and discard ---------------------------------------------------------------------
def expire_due(now=None) -> list[int]:
    """Pending approvals past their expiry count as denied ("expired"); their runs pause."""
    now = now or timezone.now()
    expired = []
    for approval in Approval.objects.pending().filter(expires_at__lt=now):
        with transaction.atomic():
            if (
                not Approval.objects.filter(pk=approval.pk)
                .pending()
                .update(status=ApprovalStatus.EXPIRED, decided_at=now, comment="expired")
            ):
                continue
            reach.approval_settled([approval.pk])
            eventlog.append(
                approval.run_id,
                EventKind.APPROVAL_DECIDED,
                decided_payload(approval, ApprovalStatus.EXPIRED, "expired"),
                actor="harness",
                session_id=approval.session_id,
            )
            run = Run.objects.get(pk=approval.run_id)
            if run.status == RunStatus.AWAITING_APPROVAL:
                lifecycle.transition(
                    run.pk,
                    RunStatus.PAUSED,
                    actor="harness",
                    reason=f"approval {approval.pk} ({approval.tool_name}) expired; resume to go on without it",
                    cause=PauseCause.APPROVAL_EXPIRED,
                )
            expired.append(approval.pk)
    return expired
