"""The runtime's side of a held change to how the checks run (agents/config_changes.py): at a
check, the agent's change to test-runner settings or to a protected file is put back as before,
and it becomes one approval for a person (asked once per change set); the agent is told it is
held and not used. When the agent calls finish again while that approval still waits, the run
has nothing else to do: it waits for the decision at zero compute (Shiftlog's own loop; an
external agent is told and calls again). The decision is told to the agent when the run goes on.
"""

from __future__ import annotations

from typing import Any

from agents import approvals, config_changes
from agents.decision_words import refusal
from agents.models import (
    Approval,
    ApprovalStatus,
    ApprovalSubject,
    ArtifactKind,
    Event,
    EventKind,
    Run,
)
from agents.runtime.slice import Slice

REASON = "config_decision"  # the harness message that tells the agent a decision


class ConfigHold:
    def __init__(self, s: Slice) -> None:
        self.s = s

    def refresh(self) -> None:
        """The baselines as the database holds them now: a person's approval changes them."""
        run = self.s.run
        row = Run.objects.filter(pk=run.pk).values("protected", "check_settings").first()
        if row is not None:
            run.protected, run.check_settings = row["protected"], row["check_settings"]

    def quiet(self, changes: list[dict[str, Any]], prints: dict[str, Any]) -> list[dict[str, Any]]:
        """The changes that are the harness's own earlier put-back of a file a person has since
        approved another version of (put back again, not the agent's work)."""
        ws = self.s.workspace.path
        return [c for c in changes if config_changes.leftover(ws, prints, c["path"])]

    def pending(self) -> set[int]:
        return set(
            Approval.objects.filter(run_id=self.s.run_id, subject=ApprovalSubject.CONFIG_CHANGE)
            .pending()
            .values_list("pk", flat=True)
        )

    def hold(self, held: list[config_changes.Held]) -> list[str]:
        """Ask a person about the agent's change (once per change set); what the agent reads."""
        s, run = self.s, self.s.run
        if not held:
            waiting = Approval.objects.filter(pk__in=self.pending()).order_by("pk")
            return [
                f"HELD: your change to how the checks run "
                f"({config_changes.paths(a.tool_input)}) still waits for a person (approval "
                f"{a.pk}); the checks ran without it."
                for a in waiting
            ]
        call_id = config_changes.call_id(held)
        names = ", ".join(h.path for h in held)
        approval = Approval.objects.filter(run_id=s.run_id, tool_use_id=call_id).first()
        if approval is None:
            flood = approvals.flood(run, 1)
            if flood:
                return [
                    f"HELD: your change to how the checks run ({names}) was not used, and not "
                    f"asked of a person: {flood}."
                ]
            tool_input = config_changes.request_input(held, run.check_settings, run.protected)
            for h in held:  # kept where people (and the store's prune) see them
                if h.data is not None:
                    s.store_artifact(f"held/{h.path}", ArtifactKind.FILE, h.data)
            created, appended = approvals.request(
                run,
                [(call_id, config_changes.TOOL, tool_input, f"the agent changed {names}")],
                session_id=s.session_id,
                seq=s.known_seq,
                actor=s.owner,
                lease_owner=s.owner,
                subject=ApprovalSubject.CONFIG_CHANGE,
            )
            s.absorb(appended)
            return [
                f"HELD: your change to how the checks run ({names}) was not used: the checks "
                "ran with the run's start version (or the last one a person approved), which "
                f"is back in the workspace. A person is asked to approve it (approval "
                f"{created[call_id].pk}); until then it is not used. Go on with other work, or "
                "call finish again to wait for the decision."
            ]
        if approval.status == ApprovalStatus.PENDING:
            return [
                f"HELD: your change to how the checks run ({names}) still waits for a person "
                f"(approval {approval.pk}); it was not used. Call finish again to wait for the "
                "decision."
            ]
        if approval.status == ApprovalStatus.APPROVED:
            return [f"Your change to {names} was approved (approval {approval.pk})."]
        return [
            f"NOT USED: a person did not approve this change to how the checks run ({names}): "
            f"{refusal(approval)}. The checks keep using the run's start version; make the "
            "change in the code, not in the test settings."
        ]

    def tell_decisions(self) -> None:
        """Tell the agent what people decided about its held changes since it last heard (the
        text reaches it after the results of any open tool call: agents/runtime/conversation.py)."""
        s = self.s
        # The decisions first: most runs have none, and then the log is not read at all.
        decided = list(
            Approval.objects.filter(run_id=s.run_id, subject=ApprovalSubject.CONFIG_CHANGE)
            .exclude(status=ApprovalStatus.PENDING)
            .select_related("decided_by")
            .order_by("pk")
        )
        if not decided:
            return
        told = set(
            Event.objects.filter(
                run_id=s.run_id, kind=EventKind.HARNESS_MESSAGE, payload__reason=REASON
            ).values_list("payload__approval_id", flat=True)
        )
        for approval in (a for a in decided if a.pk not in told):
            names = config_changes.paths(approval.tool_input)
            if approval.status == ApprovalStatus.APPROVED:
                comment = f" Their comment: {approval.comment}" if approval.comment else ""
                text = (
                    f"A person approved your change to how the checks run ({names}): the "
                    f"checks use your version from now on (it is put back in the workspace at "
                    f"the next check).{comment}"
                )
            else:
                text = (
                    f"Your change to how the checks run ({names}) was not approved: "
                    f"{refusal(approval)}. The checks keep using the run's start version."
                )
            appended = s.append(
                s.event(
                    EventKind.HARNESS_MESSAGE,
                    {"text": text, "reason": REASON, "approval_id": approval.pk},
                )
            )
            s.conv.add_text(appended.events[0].seq, text)
