"""Session boundaries: opening a session (a fresh one from goal + handoff, or the open one
rebuilt from the log), its limits, the handoff that ends it, and ending it.

A context reset is a first-class operation, not a crash: at its limit a session is asked for a
structured handoff; if the agent ignores the request for HANDOFF_GRACE_TURNS turns, the harness
writes one itself. Either way the handoff is stored (on the session and as an artifact), its drift
from the goal is measured, the ratchet runs the checks, the session ends with a checkpoint, and the
next session starts from the goal, the done-conditions and that handoff, never from old
transcripts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, NoReturn

from django.db import transaction
from django.utils import timezone

from agents import checkpoints, done_conditions, eventlog, memory, trace_parts, verification
from agents.models import (
    Approval,
    ArtifactKind,
    Checkpoint,
    CheckpointKind,
    EndReason,
    Event,
    EventKind,
    Run,
    RunStatus,
    Session,
    SessionStatus,
)
from agents.runtime import prompts
from agents.runtime.budgets import Budgets
from agents.runtime.conversation import Conversation
from agents.runtime.slice import Slice, SliceOver, SliceResult

# Turns the agent gets after being asked for a handoff before the harness writes one itself.
HANDOFF_GRACE_TURNS = 2


class Sessions:
    """Owns the open session's state on the slice (session, conv, handoff_asked_at, approvals,
    previous_meta: slice.OWNERS); the other parts change it through the methods below."""

    def __init__(self, s: Slice, budgets: Budgets) -> None:
        self.s = s
        self.budgets = budgets
        # Runs the checks at a handoff (the ratchet's reading at that checkpoint), or returns
        # them to run beside the next session's start: Finish.ratchet, given by ratchet_with.
        self.ratchet: Callable[[], Callable[[Checkpoint], None] | None] = lambda: None
        # What the test-suite checks count at the run's start (Finish.baseline): kept on the
        # start checkpoint, the ratchet's floor (agents/suite_guard.py).
        self.baseline: Callable[[], dict] | None = None
        self._took_start_checkpoint = False  # the last _start took the run's first checkpoint

    def ratchet_with(
        self,
        ratchet: Callable[[], Callable[[Checkpoint], None] | None],
        *,
        baseline: Callable[[], dict] | None = None,
    ) -> None:
        """Finish's hooks: the ratchet at handoffs, the suite's baseline at the run's start."""
        self.ratchet = ratchet
        self.baseline = baseline

    # --- the session state others change ------------------------------------------------
    def adopt(self, session: Session) -> None:
        """Work on `session` (a finished one whose success is being completed)."""
        self.s.session = session

    def asked(self, created: dict[str, Approval]) -> None:
        """Approvals just requested for calls of the open turn, by tool_use_id."""
        self.s.approvals = {**self.s.approvals, **created}

    def forget_approvals(self) -> None:
        """Decisions of the previous turn's calls are of no use to the next one's."""
        self.s.approvals = {}

    def turn_taken(self, meta: dict[str, Any]) -> None:
        """The provider's place after a turn (a rewind or fork moves it back)."""
        self.s.previous_meta = meta

    # --- opening ------------------------------------------------------------------------
    def open(self) -> None:
        """Continue the open session, or start the next; then rebuild its conversation."""
        s = self.s
        s.session = (
            Session.objects.filter(run_id=s.run_id)
            .exclude(status=SessionStatus.ENDED)
            .order_by("-index")
            .first()
        )
        if s.session is not None:
            self._rebuild()
            return
        # A new session holds only its first message, and no call is open: what _rebuild would
        # read back from the log, the slice knows (a run's start is most of what hundreds of
        # runs starting together cost one process).
        s.session = self._start()
        s.conv = Conversation.from_events([self._started])
        s.previous_meta = checkpoints.provider_meta(s.run)
        if not self._took_start_checkpoint:  # else Slice.checkpoint counted none since
            s.count_file_changes(self._file_changes_since_checkpoint())
        s.approvals = {}

    def open_next(self) -> None:
        """Start the next session in the slice that ended the last one (after a handoff): what
        `_rebuild` would read from the log, the slice knows (the new session holds only its
        first message; the session-end checkpoint was just taken; no call is open)."""
        s = self.s
        s.session = self._start()
        s.conv = Conversation.from_events([self._started])
        s.count_file_changes(0)
        s.handoff_asked_at = None
        s.approvals = {}

    def _start(self) -> Session:
        s, run = self.s, self.s.run
        previous = Session.objects.filter(run_id=s.run_id).order_by("-index").first()
        index = previous.index + 1 if previous else 1
        if run.max_sessions and index > run.max_sessions:
            self.budgets.exceed(f"max sessions ({run.max_sessions}) reached")
        self.budgets.warn_if_near("sessions", index, run.max_sessions)
        notes = self._notes_since(previous)
        handoff = previous.handoff if previous else None
        resume = run.resume
        fresh_resume = resume is not None and not resume.consumed
        rewind_note = ""
        if fresh_resume:
            # After a rewind or a fork: start from the checkpoint's state plus the person's note.
            handoff = resume.handoff
            if resume.note:
                # Named by its number, as people see it, not by its row's id.
                number = (
                    Checkpoint.objects.filter(pk=resume.checkpoint_id)
                    .values_list("number", flat=True)
                    .first()
                )
                rewind_note = f"(with the rewind to checkpoint {number}) {resume.note}"
        parts = prompts.wake_up_parts(
            goal=run.goal,
            checks=run.checks,
            rubric=run.rubric,
            session_index=index,
            max_sessions=run.max_sessions,
            max_turns=run.max_turns_per_session,
            handoff=handoff,
            check_results=done_conditions.latest_results(s.run_id, run),
            listing=s.workspace.listing(),
            notes=notes,
            acceptance=run.acceptance,
            rewind_note=rewind_note,
            memory=memory.wake_up_section(run)[0],
            changed_by_people=memory.changes_by_people(
                s.run_id, previous.first_seq if previous else 0, Event.objects.ranges_of(run)
            ),
        )
        message = prompts.assemble(parts)
        with transaction.atomic():
            session = Session.objects.create(
                run_id=s.run_id, index=index, wake_up=prompts.wake_up_record(parts)
            )
            appended = eventlog.append_many(
                s.run_id,
                [
                    eventlog.NewEvent(
                        EventKind.SESSION_STARTED,
                        {"index": index, "first_message": message},
                        session_id=session.pk,
                        actor=s.owner,
                    )
                ],
                lease_owner=s.owner,
            )
            # _rebuild reads first_seq from this object: it must not stay at the default 0.
            session.first_seq = appended.events[0].seq
            Session.objects.filter(pk=session.pk).update(first_seq=session.first_seq)
            if fresh_resume:
                run.resume_state = replace(resume, consumed=True).as_json()
                Run.objects.filter(pk=run.pk).update(resume_state=run.resume_state)
        s.absorb(appended)
        started = appended.events[0]
        self._started = (started.seq, started.kind, started.payload)
        s.session = session
        self._took_start_checkpoint = False
        if index == 1 and not Checkpoint.objects.filter(run_id=s.run_id).exists():
            self._took_start_checkpoint = True
            kind = CheckpointKind.FORK if run.forked_from_id else CheckpointKind.RUN_START
            floor = self.baseline() if self.baseline is not None else {}
            start = s.checkpoint(kind, "the workspace the run started from")
            if floor:
                state = {**(start.state or {}), "suite_baseline": floor}
                Checkpoint.objects.filter(pk=start.pk).update(state=state)
        return session

    def _notes_since(self, previous: Session | None) -> list[str]:
        """Notes that came in after the previous session ended: the new one's first message
        carries them."""
        ended_at = 0
        if previous is not None:
            ended_at = (
                Event.objects.filter(
                    run_id=self.s.run_id, kind=EventKind.SESSION_ENDED, session=previous
                )
                .values_list("seq", flat=True)
                .first()
            ) or 0
        return [
            f"{p.get('author', 'a person')}: {p['text']}"
            for p in Event.objects.filter(
                run_id=self.s.run_id, kind=EventKind.HUMAN_NOTE, seq__gt=ended_at
            ).values_list("payload", flat=True)
        ]

    def _rebuild(self) -> None:
        s = self.s
        session = s.session
        if session.status == SessionStatus.SUSPENDED:
            Session.objects.filter(pk=session.pk).update(status=SessionStatus.ACTIVE)
        # seq__gte keeps SQLite on the (run, seq) index range of this session; without it the
        # planner walks every event of the run to satisfy ORDER BY seq (O(history) per slice).
        rows = list(
            Event.objects.filter(run_id=s.run_id, session_id=session.pk, seq__gte=session.first_seq)
            .order_by("seq")
            .values_list("seq", "kind", "payload")
        )
        # Notes that arrived while no session was open are delivered to this one.
        orphans = list(
            Event.objects.filter(
                run_id=s.run_id,
                session__isnull=True,
                kind=EventKind.HUMAN_NOTE,
                seq__gt=session.first_seq,
            ).values_list("seq", "kind", "payload")
        )
        events = sorted(rows + orphans, key=lambda row: row[0])
        if events:
            s.read_up_to(events[-1][0])
        s.conv = Conversation.from_events(events)
        s.previous_meta = checkpoints.provider_meta(s.run)
        s.count_file_changes(self._file_changes_since_checkpoint())
        session.refresh_from_db()
        open_ids = [b["id"] for b in s.conv.open_tool_uses]
        s.approvals = {
            a.tool_use_id: a
            for a in Approval.objects.filter(
                run_id=s.run_id, tool_use_id__in=open_ids
            ).select_related("decided_by")
        }

    def _file_changes_since_checkpoint(self) -> int:
        return Event.objects.filter(
            run_id=self.s.run_id,
            kind=EventKind.TOOL_CALL,
            payload__name__in=list(checkpoints.FILE_TOOLS),
            seq__gt=Checkpoint.objects.filter(run_id=self.s.run_id)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
            or 0,
        ).count()

    # --- limits and handoffs ------------------------------------------------------------
    def check_limits(self) -> None:
        """At the session's limit ask for a handoff; after the grace turns, write one."""
        s, run, session = self.s, self.s.run, self.s.session
        why = None
        if session.turns >= run.max_turns_per_session:
            why = f"{session.turns} turns of {run.max_turns_per_session}"
        elif session.last_input_tokens >= run.max_input_tokens_per_session:
            why = f"{session.last_input_tokens} input tokens of {run.max_input_tokens_per_session}"
        if why is None:
            return
        if not s.conv.handoff_requested:
            s.harness_message(prompts.HANDOFF_REQUEST.format(why=why), reason="handoff_requested")
            s.conv.handoff_requested = True
            s.handoff_asked_at = session.turns
            return
        asked_at = (
            s.handoff_asked_at if s.handoff_asked_at is not None else run.max_turns_per_session
        )
        if session.turns >= asked_at + HANDOFF_GRACE_TURNS:
            self.hand_off(
                {
                    "summary": "The session reached its limit and the agent did not write a "
                    "handoff; the harness wrote this one. The agent's last words follow.",
                    "done": [],
                    "next_steps": [],
                    "open_questions": [],
                    "last_text": s.conv.last_text[-4000:],
                    "forced": True,
                }
            )

    def hand_off(
        self, handoff: dict[str, Any], before_end: Callable[[], None] | None = None
    ) -> NoReturn:
        """Store the handoff, measure its drift, end the session; the slice ends."""
        self.save_handoff(handoff)
        if before_end is not None:
            before_end()
        self._check_drift(handoff)  # the agent's and the harness's alike (see handoff_text)
        self.end(EndReason.HANDOFF)
        raise SliceOver(SliceResult.HANDOFF)

    def save_handoff(self, handoff: dict[str, Any]) -> None:
        s = self.s
        Session.objects.filter(pk=s.session.pk).update(handoff=handoff)
        s.session.handoff = handoff
        text = f"# Handoff from session {s.session.index}\n\n{prompts.handoff_markdown(handoff)}\n"
        s.store_artifact(
            f"handoff-session-{s.session.index}.md",
            ArtifactKind.HANDOFF,
            text.encode(),
            "text/markdown",
        )

    def _check_drift(self, handoff: dict[str, Any]) -> None:
        """Record drift.warning when a handoff, the agent's or the harness's, left the goal."""
        warning = verification.drift(self.s.run.goal, handoff)
        if warning is not None:
            self.s.append(self.s.event(EventKind.DRIFT_WARNING, warning))

    # --- ending -------------------------------------------------------------------------
    def end(self, reason: str, extra: list[eventlog.NewEvent] | None = None) -> None:
        s = self.s
        s.join_deferred()
        later = self.ratchet() if reason == EndReason.HANDOFF else None
        events = [
            *(extra or []),
            s.event(EventKind.SESSION_ENDED, {"index": s.session.index, "reason": reason}),
        ]
        with transaction.atomic():
            appended = eventlog.append_many(s.run_id, events, lease_owner=s.owner)
            Session.objects.filter(pk=s.session.pk).update(
                status=SessionStatus.ENDED, end_reason=reason, ended_at=timezone.now()
            )
            trace_parts.export_later(s.run_id)  # the session's spans, in the run's trace
        s.absorb(appended)
        if reason in {EndReason.HANDOFF, EndReason.FINISHED}:
            checkpoint = s.checkpoint(
                CheckpointKind.SESSION_END, f"end of session {s.session.index} ({reason})"
            )
            if later is not None:
                s.defer(lambda: later(checkpoint), "session-end checks")

    def stop_unless_running(self) -> None:
        """Between steps: if a person paused, cancelled or otherwise moved the run, stop."""
        s = self.s
        if s.status != RunStatus.RUNNING:
            s.suspend_session()
            if s.status == RunStatus.CANCELLED:
                self.end(EndReason.CANCELLED)
            raise SliceOver(SliceResult.of_status(s.status))
