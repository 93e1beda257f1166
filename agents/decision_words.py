"""What the agent is told of a person's decision, in one place for every runtime (Shiftlog's own
loop, an external agent's answers, the egress proxy's hosts)."""

from __future__ import annotations

import json

from agents.models import Approval, ApprovalStatus

# A decision nobody made, in the agent's words.
UNDECIDED = {
    ApprovalStatus.EXPIRED: "nobody decided in time (expired)",
    ApprovalStatus.DISCARDED: "the run was rewound past it, or ended (discarded)",
    ApprovalStatus.WITHDRAWN: "its agent took it back (withdrawn)",
}


def approval_note(approval: Approval) -> str:
    """What the agent is told of a person's approval: an edit, a comment."""
    note = ""
    if approval.edited_input is not None:
        note = (
            f"A person ({approval.decided_by}) edited this call before approving it. "
            f"What ran: {json.dumps(approval.edited_input)}"
        )
    if approval.comment:
        note += ("\n" if note else "") + f"Their comment: {approval.comment}"
    return note


def refusal(approval: Approval) -> str:
    """Why a call a person was asked about did not go ahead: their reason, or what happened
    instead of a decision."""
    if approval.status in UNDECIDED:
        return UNDECIDED[approval.status]
    return approval.comment or str(approval.status)


def denied_output(approval: Approval) -> str:
    """The `tool.result` of a call a person denied (or nobody decided): what the agent reads."""
    return f"A person denied this call: {refusal(approval)}. It did not run; carry on without it."
