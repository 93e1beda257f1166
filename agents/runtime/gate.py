"""The gate every tool call passes: its input validated once and the policy asked once when the
model's turn arrives, the outcome carried with the call (`GatedCall`) to where it runs; and the
wait for a person when the policy says ask.

Waiting costs nothing: the calls of a turn that need a person are all asked at once, a checkpoint
is taken, and the run goes to `awaiting_approval` while its worker returns. When the last one is
decided the run is queued again, and the next slice finds the decisions here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import transaction

from agents import approvals, policy, protected_paths, sandbox
from agents.decision_words import approval_note, denied_output
from agents.models import (
    Approval,
    ApprovalStatus,
    Checkpoint,
    CheckpointKind,
    Run,
    RunStatus,
)
from agents.runtime.sessions import Sessions
from agents.runtime.slice import Slice, SliceOver, SliceResult

NOT_ASKED = "Not asked of a person"


@dataclass
class GatedCall:
    """A tool call of the model's turn, with what the gate found."""

    block: dict[str, Any]  # the tool_use block as the model sent it
    tool_input: dict[str, Any] | None = None  # validated, defaults filled in; None if invalid
    error: str = ""  # why the input is invalid, for the model
    decision: policy.Decision | None = None  # allow | ask | deny, and why
    approval: Approval | None = None  # when a person is (or was) asked

    @property
    def id(self) -> str:
        return self.block["id"]

    @property
    def name(self) -> str:
        return self.block["name"]

    @property
    def action(self) -> str:
        """allow, ask, deny, or invalid."""
        return self.decision.action if self.decision is not None else "invalid"


@dataclass
class Cleared:
    """A call cleared to run: with the input to run (edited, maybe) and a note for the agent."""

    tool_input: dict[str, Any]
    approval: Approval | None = None
    note: str = ""


class Gate:
    def __init__(self, s: Slice, sessions: Sessions) -> None:
        self.s = s
        self.sessions = sessions
        # Why this slice's asks were refused as a flood (agents/approvals.py, `flood`): the calls
        # are refused and the run pauses once the turn's other calls are done.
        self.flooded = ""

    def plan(self, blocks: list[dict[str, Any]]) -> list[GatedCall]:
        """Validate each call once and ask the policy once (a call a person was asked about
        before keeps its approval)."""
        calls = []
        for block in blocks:
            try:
                tool_input = sandbox.validate_input(block["name"], block.get("input"))
            except sandbox.ToolInputError as e:
                calls.append(GatedCall(block, error=str(e)))
                continue
            calls.append(
                GatedCall(
                    block,
                    tool_input,
                    decision=self.decide(block["name"], tool_input),
                    approval=self.s.approvals.get(block["id"]),
                )
            )
        return calls

    def decide(self, name: str, tool_input: dict[str, Any]) -> policy.Decision:
        run = self.s.run
        return protected_paths.decide_call(
            self.s.rules,
            name,
            tool_input,
            workspace=self.s.workspace,
            protected=run.protected,
            protected_action=run.protected_action,
            sandboxed=self.sandboxed,
        )

    @property
    def sandboxed(self) -> bool:
        """The run's commands run in our bubblewrap here (an external agent's run on its own
        machine: never), and the operator has not asked to be asked about opaque code anyway."""
        return (
            self.s.isolation == "bwrap"
            and not self.s.run.is_external
            and not settings.SHIFTLOG["ASK_OPAQUE_IN_SANDBOX"]
        )

    # --- a person's decision ------------------------------------------------------------
    def ask(self, calls: list[GatedCall]) -> None:
        """Ask a person about every call that needs one and has not been asked yet."""
        s = self.s
        asks = [c for c in calls if c.action == "ask" and c.approval is None]
        if not asks:
            return
        flood = approvals.flood(s.run, len(asks))
        if flood:
            self.flooded = flood
            for c in asks:
                c.decision = policy.Decision("deny", f"{NOT_ASKED}: {flood}")
            return
        created, appended = approvals.request(
            s.run,
            [(c.id, c.name, c.tool_input, c.decision.reason) for c in asks],
            session_id=s.session_id,
            seq=s.known_seq,
            actor=s.owner,
            lease_owner=s.owner,
        )
        s.absorb(appended)
        self.sessions.asked(created)
        for c in asks:
            c.approval = created[c.id]

    def clear(self, call: GatedCall) -> Cleared | None:
        """What the call may run with; None when it must not run (its result says why). A call
        waiting for a person ends the slice here."""
        s = self.s
        if call.action == "ask" and call.approval is None:
            self.ask([call])  # refused as a flood, it is denied below: never run unasked
        if call.action == "deny" and call.approval is None:
            if call.decision.reason.startswith(NOT_ASKED):
                output = (
                    f"{call.decision.reason}. It did not run; the run pauses until a person has "
                    "looked at it. Ask for fewer things at once."
                )
            else:
                output = (
                    f"Denied by the tool policy ({call.decision.reason}): this call is not "
                    "allowed in this run. Find another way, or ask for it in your reply."
                )
            s.record_result(
                call.block,
                sandbox.ToolResult(
                    output=output,
                    is_error=True,
                    data={"policy": "deny", "rule": call.decision.rule},
                ),
            )
            return None
        if call.approval is None:
            return Cleared(call.tool_input)
        approval = call.approval
        if approval.status == ApprovalStatus.PENDING:
            approval = self.wait(approval)
        if approval.status == ApprovalStatus.APPROVED:
            return Cleared(
                approval.edited_input or call.tool_input, approval, approval_note(approval)
            )
        s.record_result(
            call.block,
            sandbox.ToolResult(
                output=denied_output(approval),
                is_error=True,
                data={"approval_id": approval.pk, "decision": approval.status},
            ),
        )
        return None

    def pause_if_flooded(self) -> None:
        """After a turn whose asks were refused as a flood: the run pauses with the reason."""
        if not self.flooded:
            return
        self.s.pause_at_limit(self.flooded)

    def wait(self, approval: Approval) -> Approval:
        """Suspend the run until a person decides; returns at once if one already has."""
        return wait_for(self.s, approval)


def wait_for(s: Slice, approval: Approval) -> Approval:
    """Suspend the run until a person decides `approval` (a checkpoint first, once); returns at
    once if one already has, else ends the slice (the decision queues the run again)."""
    if not Checkpoint.objects.filter(
        run_id=s.run_id, seq__gt=approval.seq, kind=CheckpointKind.PRE_APPROVAL
    ).exists():
        s.checkpoint(
            CheckpointKind.PRE_APPROVAL,
            f"before {approval.tool_name} waited for approval {approval.pk}",
        )
    with transaction.atomic():
        # Lock the run row before the last look, as deciding does (see agents.approvals).
        Run.objects.select_for_update().filter(pk=s.run_id).first()
        approval.refresh_from_db()
        if approval.status != ApprovalStatus.PENDING:
            return approval
        waiting = Approval.objects.filter(run_id=s.run_id).pending().count()
        s.transition(
            RunStatus.AWAITING_APPROVAL,
            reason=f"waiting for a person to decide {waiting} tool call(s)",
            expect={RunStatus.RUNNING},
        )
    s.suspend_session()
    raise SliceOver(SliceResult.AWAITING)
