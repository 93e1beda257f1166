"""A fleet's parent in the runtime: spawning children, waiting for them at zero compute, hearing
how they ended, and merging their work.

- `spawn`: a checkpoint first (the children start from it), then in one transaction the children
  (agents/fleets/spawn.py), the call's result and the move to `waiting_for_children`; the slice
  ends and the worker and the lease go. A child's end wakes the parent (agents/lifecycle.py).
- `at_start`: when a slice opens, a parent that owes a wait (resumed while its children still run)
  goes back to waiting; one that woke reads its children's outcomes; merge conflicts a person
  has decided are applied.
- `merge`: a checkpoint before and after; each succeeded child's change three-way merged
  (agents/fleets/merging.py), all of a child or nothing. A worker that dies mid-merge leaves the call
  open: the retry puts the workspace back to the checkpoint before and merges again.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import transaction

from agents import approvals, done_conditions, faults, hooks, sandbox, workspaces
from agents.fleets import merging
from agents.fleets import spawn as fleet_spawn
from agents.fleets import tree as fleets
from agents.models import (
    Approval,
    ApprovalStatus,
    ApprovalSubject,
    Checkpoint,
    CheckpointKind,
    Event,
    EventKind,
    FleetChild,
    Run,
    RunStatus,
    Session,
)
from agents.models.fleets import MergeState as M
from agents.runtime.gate import Gate
from agents.runtime.slice import Slice, SliceOver, SliceResult

CONFLICT_TOOL = "merge_conflict"  # a person's decision on a child's conflicting merge
OUTCOMES = "fleet_outcomes"  # the harness message that tells a woken parent how children ended


def _merge_event(s: Slice, row: FleetChild, result: str, p: merging.Plan, **extra) -> Any:
    return s.event(
        EventKind.FLEET_MERGE,
        {
            "run_id": row.child_id,
            "result": result,
            "files": p.files,
            "conflicts": [c["path"] for c in p.conflicts],
            **extra,
        },
    )


def final_tree(child: Run) -> str | None:
    last = Checkpoint.objects.filter(run=child).order_by("-seq").values_list("tree", flat=True)
    return last.first()


def register() -> None:
    """The fleet's parent in every slice, and its children's spend in its budgets."""
    hooks.slice_part.register(Fleet)
    hooks.spent_with_children.register(fleets.rollup)


class Fleet:
    def __init__(self, s: Slice, gate: Gate) -> None:
        self.s = s
        self.gate = gate
        # The harness tools this part runs (agents/runtime/calls.py asks for them by name).
        self.tools: dict[str, Callable[[dict[str, Any], dict[str, Any]], None]] = {
            "spawn_runs": self.spawn,
            "merge_children": self.merge,
        }

    # --- spawning -----------------------------------------------------------------------
    def spawn(self, block: dict[str, Any], tool_input: dict[str, Any]) -> None:
        s = self.s

        def record(spawned: list[FleetChild]) -> None:
            ids = ", ".join(str(f.child_id) for f in spawned)
            s.record_result(
                block,
                sandbox.ToolResult(
                    output=f"Started {len(spawned)} child run(s): {ids}. You now wait for "
                    f"{'the first of them' if tool_input.get('wait') == 'any' else 'them'} "
                    "to end; your next message tells you how they did.",
                    data={"children": [f.child_id for f in spawned]},
                ),
            )

        try:
            self.start_children(block["id"], tool_input, record)
        except fleet_spawn.SpawnError as e:
            s.record_result(block, sandbox.ToolResult(output=f"spawn_runs: {e}", is_error=True))
            return
        s.suspend_session()
        raise SliceOver(SliceResult.WAITING)

    def start_children(
        self,
        call_id: str,
        tool_input: dict[str, Any],
        record: Callable[[list[FleetChild]], None] | None = None,
    ) -> list[FleetChild]:
        """A checkpoint, then in one transaction the children, what `record` adds (the call's
        result) and the move to waiting_for_children. SpawnError when it cannot be done."""
        s = self.s
        checkpoint = s.checkpoint(CheckpointKind.MANUAL, "the workspace the children start from")
        with transaction.atomic():
            spawned = fleet_spawn.spawn(
                s.run,
                call_id,
                tool_input,
                checkpoint,
                actor=s.owner,
                lease_owner=s.owner,
                session_id=s.session_id,
            )
            faults.point("fleet.spawn")
            if record is not None:
                record(spawned)
            s.transition(
                RunStatus.WAITING_FOR_CHILDREN,
                reason="waiting for child runs " + ", ".join(str(f.child_id) for f in spawned),
                expect={RunStatus.RUNNING},
            )
        return spawned

    # --- when a slice opens ---------------------------------------------------------------
    def at_start(self) -> None:
        s = self.s
        if not FleetChild.objects.filter(parent_id=s.run_id).exists():
            return
        seqs = self._latest_seqs()
        if seqs["spawned"] > seqs["woke"]:
            self._wait_or_wake()
            seqs["woke"] = s.known_seq
        if seqs["woke"] > seqs["told"]:
            s.harness_message(outcomes(s.run), reason=OUTCOMES)
        self._apply_decided()

    def _latest_seqs(self) -> dict[str, int]:
        live = Event.objects.on_live_branch(self.s.run_id)
        latest = {
            name: live.filter(kind=kind).order_by("-seq").values_list("seq", flat=True).first() or 0
            for name, kind in (("spawned", EventKind.FLEET_SPAWNED), ("woke", EventKind.FLEET_WOKE))
        }
        latest["told"] = (
            live.filter(kind=EventKind.HARNESS_MESSAGE, payload__reason=OUTCOMES)
            .order_by("-seq")
            .values_list("seq", flat=True)
            .first()
            or 0
        )
        return latest

    def _wait_or_wake(self) -> None:
        """Resumed (or restarted) before its wait was over: wait again, under the run's row lock
        so that a child ending meanwhile is not missed; or, the wait being over, wake now."""
        s = self.s
        with transaction.atomic():
            Run.objects.select_for_update().filter(pk=s.run_id).first()
            wait = fleets.wait_state(s.run)
            if wait.over:
                s.append(
                    s.event(
                        EventKind.FLEET_WOKE, {"reason": wait.reason, "children": wait.children}
                    )
                )
                return
            s.transition(
                RunStatus.WAITING_FOR_CHILDREN,
                reason="its children are still running",
                expect={RunStatus.RUNNING},
            )
        s.suspend_session()
        raise SliceOver(SliceResult.WAITING)

    # --- merging --------------------------------------------------------------------------
    def merge(self, block: dict[str, Any], tool_input: dict[str, Any]) -> None:
        s = self.s
        rows, problem = self._to_merge(tool_input.get("runs"))
        if problem or not rows:
            s.record_result(
                block,
                sandbox.ToolResult(
                    output=f"merge_children: {problem or 'no succeeded child is left to merge'}",
                    is_error=bool(problem),
                ),
            )
            return
        label = f"before merge_children {block['id']}"
        before = Checkpoint.objects.filter(run_id=s.run_id, label=label).first()
        if before is not None:  # a worker died mid-merge: start again from where it started
            workspaces.restore(s.run, before.tree)
        else:
            s.checkpoint(CheckpointKind.MERGE, label)
        # Until its result commits the copy here is that checkpoint plus a part of the merge
        # (workspaces.unsettle, as for any call that writes).
        workspaces.unsettle(s.run)
        store = workspaces.store()
        events, lines, asked = [], [], []
        for row in rows:
            theirs = final_tree(row.child)
            if theirs is None:  # it ended before its first checkpoint: nothing of it to merge
                lines.append(f"Run {row.child_id}: it has no checkpoint; nothing to merge.")
                continue
            p = merging.plan(store, row.base_tree, theirs, s.workspace, row.folder)
            if p.clean:
                merging.apply(s.workspace, p)
                faults.point("fleet.merge")
                row.merge_state = M.APPLIED
                events.append(_merge_event(s, row, "applied", p))
                lines.append(f"Run {row.child_id}: merged ({len(p.files)} file(s) changed).")
                continue
            if s.run.fleet_conflicts == "person":
                asked.append(self._ask(block, row, p))
                row.merge_state = M.ASKED
                lines.append(
                    f"Run {row.child_id}: conflicts in {', '.join(c['path'] for c in p.conflicts)}"
                    "; nothing of it was applied. A person decides them (ours, theirs or an "
                    "edit); you wait for that."
                )
            else:
                row.merge_state = M.CONFLICT
                lines.append(conflict_text(row, p))
            events.append(_merge_event(s, row, "conflict", p))
        with transaction.atomic():
            for row in rows:
                FleetChild.objects.filter(pk=row.pk).update(merge_state=row.merge_state)
            s.record_result(block, sandbox.ToolResult(output="\n\n".join(lines)), *events)
        s.checkpoint(CheckpointKind.MERGE, f"after merge_children {block['id']}")
        if asked:
            self.gate.wait(asked[0])

    def _to_merge(self, wanted: list[int] | None) -> tuple[list[FleetChild], str]:
        every = FleetChild.objects.filter(parent_id=self.s.run_id).select_related("child")
        spawns = fleets.live_spawns(self.s.run_id)
        rows = [r for r in every if r.tool_use_id in spawns]
        if wanted is None:
            return [
                r for r in rows if r.child.status == RunStatus.SUCCEEDED and not r.merge_state
            ], ""
        mine = {r.child_id: r for r in rows}
        abandoned = {r.child_id for r in every} - set(mine)
        for run_id in wanted:
            row = mine.get(run_id)
            if run_id in abandoned:
                return [], f"run {run_id} was spawned on a branch a rewind abandoned"
            if row is None:
                return [], f"run {run_id} is not a child of this run"
            if row.child.status != RunStatus.SUCCEEDED:
                return [], f"run {run_id} is {row.child.status}; only a succeeded child merges"
            if row.merge_state in (M.APPLIED, M.RESOLVED, M.ASKED):
                return [], f"run {run_id} is merged already ({row.merge_state})"
        return [mine[i] for i in dict.fromkeys(wanted)], ""

    def _ask(self, block: dict[str, Any], row: FleetChild, p: merging.Plan) -> Approval:
        s = self.s
        created, appended = approvals.request(
            s.run,
            [
                (
                    f"{block['id']}/merge/{row.child_id}",
                    CONFLICT_TOOL,
                    {"run_id": row.child_id, "choose": "theirs", "conflicts": p.conflicts},
                    f"merging child run {row.child_id} conflicts with this run's own changes "
                    "(approve: take the child's version; edit choose to 'ours' to keep this "
                    "run's, or give files {path: text}; deny: keep this run's)",
                )
            ],
            session_id=s.session_id,
            seq=s.known_seq,
            actor=s.owner,
            lease_owner=s.owner,
            subject=ApprovalSubject.MERGE_CONFLICT,
        )
        s.absorb(appended)
        return next(iter(created.values()))

    def _apply_decided(self) -> None:
        """Conflicting merges a person has decided since: applied with their choice."""
        s = self.s
        for row in FleetChild.objects.filter(parent_id=s.run_id, merge_state=M.ASKED):
            approval = (
                Approval.objects.filter(
                    run_id=s.run_id,
                    subject=ApprovalSubject.MERGE_CONFLICT,
                    tool_input__run_id=row.child_id,
                )
                .exclude(status=ApprovalStatus.PENDING)
                .order_by("-pk")
                .first()
            )
            if approval is None:
                continue
            if approval.status == ApprovalStatus.APPROVED:
                resolution = approval.edited_input or approval.tool_input
            else:
                resolution = {"choose": "ours"}
            label = f"before resolving the merge of run {row.child_id} ({approval.pk})"
            before = Checkpoint.objects.filter(run_id=s.run_id, label=label).first()
            if before is not None:
                workspaces.restore(s.run, before.tree)
            else:
                s.checkpoint(CheckpointKind.MERGE, label)
            p = merging.plan(
                workspaces.store(),
                row.base_tree,
                final_tree(row.child),
                s.workspace,
                row.folder,
                resolution=resolution,
            )
            if p.clean:
                merging.apply(s.workspace, p)
            text = (
                f"A person decided the conflicting merge of child run {row.child_id} "
                f"({'; '.join(c['path'] for c in p.conflicts) or resolution_name(resolution)}): "
                + ("it is merged now." if p.clean else "their choice still conflicts; it is not.")
            )
            with transaction.atomic():
                FleetChild.objects.filter(pk=row.pk).update(
                    merge_state=M.RESOLVED if p.clean else M.CONFLICT
                )
                s.append(
                    _merge_event(
                        s,
                        row,
                        "applied" if p.clean else "conflict",
                        p,
                        approval_id=approval.pk,
                        resolution=resolution_name(resolution),
                    )
                )
                s.harness_message(text, reason="fleet_merge_decided")
            s.checkpoint(CheckpointKind.MERGE, f"after resolving the merge of run {row.child_id}")


def resolution_name(resolution: dict[str, Any]) -> str:
    if isinstance(resolution.get("files"), dict):
        return "edited"
    return str(resolution.get("choose", "theirs"))


def conflict_text(row: FleetChild, p: merging.Plan) -> str:
    parts = [
        f"Run {row.child_id}: its changes conflict with yours, so none of them was applied. "
        "Resolve each file below yourself (write the version you want), then carry on; "
        f"merge_children with runs [{row.child_id}] tries the rest again."
    ]
    for c in p.conflicts:
        if c["merged"] is not None:
            parts.append(
                f"--- {c['path']} (both changed it; conflict markers show both)\n{c['merged']}"
            )
        else:
            parts.append(f"--- {c['path']}: yours is {c['ours']}, the child's is {c['theirs']}")
    return "\n".join(parts)


def outcomes(run: Run) -> str:
    """What a woken parent reads: each child of its latest spawn, how it ended, its final
    handoff, its checks and the files it changed."""
    store = workspaces.store()
    parts = ["Your child runs:"]
    for row in fleets.latest_spawn(run):
        child = row.child
        session = Session.objects.filter(run=child, handoff__isnull=False).order_by("-index")
        handoff = session.values_list("handoff", flat=True).first()
        finish = (
            Event.objects.on_live_branch(child.pk)
            .filter(kind=EventKind.TOOL_CALL, payload__name="finish")
            .order_by("-seq")
            .values_list("payload", flat=True)
            .first()
        )
        checks = [
            f"{'passed' if r['passed'] else 'FAILED'}: {r['command']}"
            for r in done_conditions.latest_results(child.pk)
        ]
        tree = final_tree(child)
        changed = (
            [
                f"{row.folder}/{c.path}" if row.folder else c.path
                for c in store.diff(row.base_tree, tree, text_diffs=False)
                if c.new_type != "d" and c.old_type != "d"
            ]
            if tree
            else []
        )
        summary = (finish or {}).get("input", {}).get("summary") or (handoff or {}).get(
            "summary", ""
        )
        parts.append(
            f"- Run {child.pk} ({child.status}{': ' + child.status_reason if child.status_reason else ''})"
            f": {child.goal[:200]}\n  Final word: {summary or '(none)'}\n"
            f"  Checks: {'; '.join(checks) or '(none run)'}\n"
            f"  Files changed: {', '.join(changed) or '(none)'}"
        )
    parts.append("merge_children brings the succeeded children's changes into your workspace.")
    return "\n".join(parts)
