"""Running a turn's tool calls, in the model's order, each at most once.

A call's `tool.call` event is committed before the tool runs and its `tool.result` after, so a
worker that dies mid-tool leaves a call without a result: the next slice closes it as interrupted
(`recover`) instead of running it again. Workspace tools run in the sandbox; the harness tools
(save_artifact, handoff, finish, remember, recall) are the harness's own.

One exception keeps the common step to one transaction: when a turn's first call only reads the
workspace (READ_ONLY_TOOLS) and nothing stands in its way, it runs before the turn is recorded
and its result goes into the turn's transaction (`read_first`). A worker that dies before that
commit leaves nothing of the turn: the next slice asks the model again, exactly as after a death
during the model call, and the read (which changed nothing) is simply done again. Nothing that
was committed is lost, and no call with an effect ever runs without its tool.call committed first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.conf import settings

from agents import checkpoints, dbconn, hooks, memory, sandbox, workspaces
from agents.eventlog import NewEvent
from agents.models import Approval, ArtifactKind, CheckpointKind, EventKind
from agents.runtime import ledger
from agents.runtime.conversation import INTERRUPTED
from agents.runtime.finish import Finish
from agents.runtime.gate import Cleared, Gate, GatedCall
from agents.runtime.network import Network
from agents.runtime.sessions import Sessions
from agents.runtime.slice import Slice


def call_event(
    s: Slice,
    block: dict[str, Any],
    tool_input: dict[str, Any] | None = None,
    approval: Approval | None = None,
) -> NewEvent:
    """The `tool.call` event of a call, with the input it runs with."""
    payload = {
        "tool_use_id": block["id"],
        "name": block["name"],
        "input": block.get("input") if tool_input is None else tool_input,
    }
    if approval is not None:
        payload["approval_id"] = approval.pk
    return s.event(EventKind.TOOL_CALL, payload, actor="agent")


# Calls a dead worker left open that are done again rather than closed as interrupted: the
# fleet's (idempotent), and finish, whose checks the harness runs again (an agent that said it was
# done should not have to say so twice because a worker died; found by bench/chaos.py).
RETRIED = frozenset({"spawn_runs", "merge_children", "finish"})
# Workspace tools that change nothing: running one again after a crash is the same as running it
# once, so its call need not be durable before it runs.
READ_ONLY_TOOLS = frozenset({"read_file", "list_files"})


class Calls:
    def __init__(
        self,
        s: Slice,
        gate: Gate,
        sessions: Sessions,
        finish: Finish,
        network: Network,
    ) -> None:
        self.s = s
        # Features' parts of the slice (a fleet's parent), through the hooks they register.
        self.parts = hooks.slice_part.collect(s, gate)
        self.tools = {name: run for part in self.parts for name, run in part.tools.items()}
        self.gate = gate
        self.network = network
        self.sessions = sessions
        self.finish = finish

    def read_first(self, calls: list[GatedCall]) -> sandbox.ToolResult | None:
        """Run the turn's first call now, before the turn is recorded, when it only reads and
        is allowed outright (no person to ask, no note to add); its result, or None."""
        if not calls:
            return None
        call = calls[0]
        if (
            call.name not in READ_ONLY_TOOLS
            or call.action != "allow"
            or call.approval is not None
            or call.tool_input is None
        ):
            return None
        return self._sandbox(call.name, call.tool_input)

    def run(
        self, calls: list[GatedCall], *, first_called: bool = False, first_done: bool = False
    ) -> None:
        """Run the calls in order; `first_called` when the first one's tool.call went in with
        the model's turn, `first_done` when its result did too (`read_first`). Every call that
        needs a person is asked about first, at once, so people can decide them side by side."""
        self.s.join_deferred()  # the session-end checks read the workspace the calls change
        self.gate.ask(calls)
        for i, call in enumerate(calls):
            if i == 0 and first_done:
                continue
            self._run_one(call, already_called=first_called and i == 0)
        self.gate.pause_if_flooded()

    def _run_one(self, call: GatedCall, *, already_called: bool) -> None:
        s = self.s
        if call.tool_input is None:
            s.record_result(call.block, sandbox.ToolResult(output=call.error, is_error=True))
            return
        cleared = self.gate.clear(call)
        if cleared is None:
            return  # denied: the reason is the tool's result
        if not already_called:
            s.append(call_event(s, call.block, cleared.tool_input, cleared.approval))
            s.conv.add_tool_call(call.id)
        self._execute(call.block, cleared)

    def _execute(self, block: dict[str, Any], cleared: Cleared) -> None:
        s, name, tool_input = self.s, block["name"], cleared.tool_input
        if name in sandbox.WORKSPACE_TOOLS:
            writes = name not in READ_ONLY_TOOLS
            if writes:  # a read twice is no second effect
                ledger.record(s.run_id, block["id"], name)
                workspaces.unsettle(s.run)  # until the result commits (host caches)
            # The gate's validated input, unless a person's edit replaced it: that is checked.
            result = self._sandbox(name, tool_input, validated=cleared.approval is None)
            if cleared.note:
                result.output = f"{cleared.note}\n\n{result.output}"
            # What the call changed is in the store before its result commits (workspaces as
            # each host's cache): a host lost after the result loses nothing of it.
            state = s.workspace_state() if writes else None
            s.record_result(block, result, state=state)
            if writes and state is None:  # it changed nothing: the copy is where it was
                workspaces.settle(s.run, s.workspace_tree)
            if name == "bash":
                waiting = self.network.after_command(tool_input["command"])
                if waiting:  # a new host: a person decides, the run waits at zero compute
                    self.gate.wait(waiting[0])
            if name in checkpoints.FILE_TOOLS:
                changes = s.file_changed()
                every = settings.SHIFTLOG["CHECKPOINT_EVERY"]
                if every and changes >= every:
                    s.checkpoint(
                        CheckpointKind.PERIODIC, f"after {changes} file-changing tool calls"
                    )
        elif name == "save_artifact":
            s.record_result(block, self._save_artifact(tool_input))
        elif name == "remember":
            result, events = memory.remember(s.run, tool_input, actor="agent")
            s.record_result(block, result, *(replace(e, session_id=s.session_id) for e in events))
        elif name == "recall":
            s.record_result(block, memory.recall(s.run, tool_input["query"]))
        elif name == "handoff":
            self.sessions.hand_off(
                {
                    "summary": tool_input["summary"],
                    "done": tool_input.get("done", []),
                    "next_steps": tool_input.get("next_steps", []),
                    "open_questions": tool_input.get("open_questions", []),
                },
                before_end=lambda: s.record_result(
                    block, sandbox.ToolResult(output="Handoff saved. This session ends now.")
                ),
            )
        elif name == "finish":
            self.finish.finish(block)
        elif name in self.tools:  # a feature's harness tool (spawn_runs, merge_children)
            self.tools[name](block, tool_input)

    def _sandbox(
        self, name: str, tool_input: dict[str, Any], *, validated: bool = True
    ) -> sandbox.ToolResult:
        s = self.s
        dbconn.release()  # a tool may run for minutes: no database connection held meanwhile
        return sandbox.execute(
            s.workspace,
            name,
            tool_input,
            should_stop=s.heartbeat,
            bash_timeout=settings.SHIFTLOG["BASH_TIMEOUT_SECONDS"],
            output_limit=settings.SHIFTLOG["TOOL_OUTPUT_LIMIT"],
            isolation=s.isolation,
            limits=s.limits,
            toolchain=s.toolchain,
            egress=self.network.proxy,
            validated=validated,
        )

    def _save_artifact(self, tool_input: dict[str, Any]) -> sandbox.ToolResult:
        try:
            path = self.s.workspace.resolve(tool_input["path"])
            data = path.read_bytes()
        except sandbox.ToolInputError as e:
            return sandbox.ToolResult(output=str(e), is_error=True)
        except OSError as e:
            return sandbox.ToolResult(
                output=f"cannot read {tool_input['path']}: {e.strerror}", is_error=True
            )
        name = tool_input.get("name") or tool_input["path"]
        artifact = self.s.store_artifact(name, tool_input.get("kind", ArtifactKind.FILE), data)
        return sandbox.ToolResult(
            output=f"Saved artifact {name!r} ({artifact.size} bytes).",
            data={"artifact_id": artifact.pk, "blob": artifact.blob_hash},
        )

    # --- after a dead worker ------------------------------------------------------------
    def recover(self) -> None:
        """Close what a dead worker left open, so tools run at most once, and run the calls of
        the last turn that never started (those a person has decided since, among them)."""
        s = self.s
        interrupted, not_started = s.conv.unfinished_tool_uses()
        # Done again, not closed: the fleet's calls (idempotent, agents/fleets/parent.py), finish.
        retried = [b for b in interrupted if b["name"] in RETRIED]
        interrupted = [b for b in interrupted if b["name"] not in RETRIED]
        for block in retried:
            self._execute(block, Cleared(sandbox.validate_input(block["name"], block["input"])))
        for block in interrupted:
            s.record_result(
                block,
                sandbox.ToolResult(output=INTERRUPTED, is_error=True, data={"interrupted": True}),
            )
        if interrupted:
            s.append(
                s.event(
                    EventKind.ERROR,
                    {
                        "source": "recovery",
                        "message": f"a worker stopped mid-tool; closed {len(interrupted)} tool "
                        "call(s) as interrupted without running them again",
                    },
                )
            )
        if not_started:
            self.run(self.gate.plan(not_started))
        if interrupted or not_started or retried:
            self.sessions.stop_unless_running()
