"""A click in Slack, after its signature was checked (dashboard/slack_views.py): who it is in
Shiftlog, whether they may decide, and the decision through `approvals.decide_as`, the one
decision service (the same audit event as the web's, the first decision wins).

- Approve: decided at once; the message is updated by `reach.approval_settled`, as for a
  decision made anywhere else.
- Deny: opens a modal asking for the reason (views.open, within Slack's three seconds); its
  submission (`view_submission`) decides.
- An unmapped or unpermitted person, a late click, a run that ended: nothing changes, and the
  person is told why (an ephemeral message, or the modal's error).
- Link to NAME (a direct message a person had the bot send them from /me/reach/): the Slack id
  is linked to that Shiftlog user (agents/slack_link.py), and the clicker told.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents import approvals, jobs, reach, slack, slack_link
from agents.models import Approval, Reach


@dataclass
class Answer:
    """What the endpoint answers Slack (a JSON body, or an empty 200), and what it told."""

    body: dict[str, Any] | None = None
    told: list[str] = field(default_factory=list)


def person(slack_user_id: str):
    """The Shiftlog user with this Slack id, or None."""
    if not slack_user_id:
        return None
    row = Reach.objects.filter(slack_user_id=slack_user_id).select_related("user").first()
    return row.user if row is not None else None


def _approval(raw: Any) -> Approval | None:
    try:
        return approvals.get(int(str(raw)))
    except (ValueError, approvals.ApprovalError):
        return None


def refusal(slack_user_id: str, approval: Approval | None) -> str:
    """Why this Slack user may not decide this approval, or ""."""
    if approval is None:
        return "That approval does not exist (any more) in Shiftlog."
    user = person(slack_user_id)
    if user is None:
        return (
            "Your Slack account is not linked to a Shiftlog user, so Shiftlog cannot act for "
            f"you: link it yourself in Shiftlog ({slack.base_url()}/me/reach/, your member id "
            f"is {slack_user_id}), or ask an admin."
        )
    if not reach.may_decide_on(user, approval.run):
        return (
            f"You ({user.get_username()} in Shiftlog) may not decide the approvals of run "
            f"{approval.run_id}: it needs the right to decide approvals and to see the run."
        )
    return ""


def handle(payload: dict[str, Any]) -> Answer:
    kind = payload.get("type")
    if kind == "block_actions":
        return _clicked(payload)
    if kind == "view_submission" and payload.get("view", {}).get("callback_id") == slack.DENY_MODAL:
        return _deny_submitted(payload)
    return Answer()


def _tell(payload: dict[str, Any], words: str, answer: Answer) -> Answer:
    channel = (payload.get("channel") or {}).get("id") or ""
    user = (payload.get("user") or {}).get("id") or ""
    answer.told.append(words)
    if channel and user:
        jobs.later("slack_tell", channel=channel, user=user, text=words)
    return answer


def _clicked(payload: dict[str, Any]) -> Answer:
    answer = Answer()
    actions = payload.get("actions") or []
    action = actions[0] if actions else {}
    action_id = action.get("action_id")
    if action_id == slack_link.LINK:
        return _link_clicked(payload, action, answer)
    if action_id not in (slack.APPROVE, slack.DENY):
        return answer  # Open is a link: Slack tells us of the click, nothing to do
    slack_user = (payload.get("user") or {}).get("id") or ""
    approval = _approval(action.get("value"))
    why_not = refusal(slack_user, approval)
    if why_not:
        return _tell(payload, why_not, answer)
    user = person(slack_user)
    if action_id == slack.DENY:
        if approval.status != "pending":
            return _tell(payload, f"Nothing changed: {approvals.closed_words(approval)}", answer)
        channel = (payload.get("channel") or {}).get("id") or ""
        ts = (payload.get("message") or {}).get("ts") or (payload.get("container") or {}).get(
            "message_ts", ""
        )
        try:
            slack.client().views_open(
                trigger_id=payload.get("trigger_id", ""),
                view=slack.deny_modal(approval, channel=channel, ts=ts),
            )
        except Exception as e:  # Slack did not open it: say so
            words = f"Slack did not open the reason form ({type(e).__name__}): deny it on the web."
            return _tell(payload, words, answer)
        return answer
    try:
        approvals.decide_as(approval.pk, user=user, decision="approve")
    except approvals.ApprovalError as e:
        return _tell(payload, f"Nothing changed: {e}", answer)
    return answer


def _link_clicked(payload: dict[str, Any], action: dict[str, Any], answer: Answer) -> Answer:
    """A "Link to NAME" button (agents/slack_link.py): the clicker is the Slack user it was
    sent to, as Slack's signature says; they are told what happened either way."""
    slack_user = (payload.get("user") or {}).get("id") or ""
    try:
        words = slack_link.confirm(str(action.get("value") or ""), slack_user)
    except slack_link.LinkError as e:
        words = f"Not linked: {e}"
    return _tell(payload, words, answer)


def _deny_submitted(payload: dict[str, Any]) -> Answer:
    view = payload.get("view") or {}
    approval_id = str(view.get("private_metadata", "")).split("|")[0]
    slack_user = (payload.get("user") or {}).get("id") or ""
    approval = _approval(approval_id)
    why_not = refusal(slack_user, approval)
    if not why_not:
        values = ((view.get("state") or {}).get("values") or {}).get("reason") or {}
        reason = str((values.get("reason") or {}).get("value") or "").strip()
        try:
            approvals.decide_as(
                approval.pk, user=person(slack_user), decision="deny", reason=reason
            )
        except approvals.ApprovalError as e:
            why_not = f"Nothing changed: {e}"
    if why_not:
        return Answer(
            body={"response_action": "errors", "errors": {"reason": why_not[:3000]}},
            told=[why_not],
        )
    return Answer()
