"""The offline provider: plays a script of assistant turns through the real runtime and tools.

A script is JSON:

    {"name": "demo", "description": "...",
     "turns": [{"text": "...", "tool_calls": [{"name": "write_file", "input": {...}}]}, ...]}

Each turn has optional `text` and optional `tool_calls`; a turn with no tool call ends the
agent's turn (stop_reason end_turn). An optional top-level `turn_delay_seconds` simulates model
latency (the demo uses it so people can watch it work). The provider keeps its place in the script in the turn's
`meta` (script_index), which the runtime stores in the model.turn event, so it is stateless and
survives a crash or a change of worker. When the harness asks for a handoff and the next scripted
turn is not one, it writes a generic handoff without using up the script. When the script runs
out before the run is done, the run fails with that reason.

A script may branch on what people did (a denial's reason, a note, a rewind's note): see
agents/providers/script_branches.py. A turn's `delay_factor` (0 to 10) stretches the delay for
that turn. A script with a delay is called like a real model, on a thread of its own while the
worker keeps the run's lease (Slice.call_model); one without answers at once (`instant`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agents import inputs, schemas
from agents.providers import script_branches
from agents.providers.base import ScriptExhausted, Turn, TurnRequest, Usage

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
OFFLINE_MODEL = "scripted"


class ScriptError(ValueError):
    """A script that cannot be played; the message says where and why."""


def validate_script(script: Any) -> dict[str, Any]:
    """The script, if it is one (agents/schemas/script.schema.json); else ScriptError saying
    where it is wrong. A script that passes cannot crash the runtime later."""
    problem = schemas.first_error("script", script)
    if problem is None:
        problem = script_branches.problem(script)
    if problem is not None:
        raise ScriptError(problem)
    return script


def load_script(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = inputs.load_json(path.read_bytes(), what=str(path))
    except FileNotFoundError:
        raise ScriptError(f"script file not found: {path}") from None
    except OSError as e:
        raise ScriptError(f"cannot read {path}: {e.strerror}") from None
    except inputs.InputError as e:
        raise ScriptError(str(e)) from None
    return validate_script(data)


def builtin_script(name: str) -> dict[str, Any]:
    return load_script(SCRIPTS_DIR / f"{name}.json")


def _handoff_turn(script_index: int, suffix: str, chose: list[dict[str, Any]]) -> Turn:
    meta: dict[str, Any] = {"script_index": script_index, "synthesized": "handoff"}
    if chose:
        # Choices made as the harness asked for the handoff: the next session plays them.
        meta["pending"] = chose
    return Turn(
        content=[
            {"type": "text", "text": "Writing my handoff as asked."},
            {
                "type": "tool_use",
                "id": f"toolu_scripted_handoff_{script_index}{suffix}",
                "name": "handoff",
                "input": {
                    "summary": "Scripted agent: handing off where the script stands.",
                    "done": [],
                    "next_steps": ["Continue with the script."],
                    "open_questions": [],
                },
            },
        ],
        stop_reason="tool_use",
        usage=Usage(),
        model=OFFLINE_MODEL,
        meta=meta,
    )


class ScriptedProvider:
    name = "scripted"
    offline = True

    def __init__(self, script: dict[str, Any], *, validated: bool = False):
        # A stored script (RunScript) was validated when its run was created (create_run is
        # its only writer): checking it again cost O(script) at every slice (~0.5 s for 600
        # turns), which every session change paid.
        self.script = script if validated else validate_script(script)
        self.plan = script_branches.Plan(self.script["turns"])
        self.delay = float(self.script.get("turn_delay_seconds", 0))
        # No simulated latency: the slice calls it in its own thread (Slice.call_model).
        self.instant = not self.delay

    def next_turn(self, request: TurnRequest) -> Turn:
        # script_index in meta is the index of the last turn played (-1: none yet), in document
        # order with every branch's turns.
        previous = request.previous_meta
        last = previous.get("script_index", -1)
        # Choices a handoff carried from the previous session (see _handoff_turn).
        pending = previous.get("pending", []) if previous.get("synthesized") else []
        choose = script_branches.chooser(request.messages, pending)
        leaf, chose = self.plan.upcoming(last, choose)
        upcoming = leaf.turn if leaf is not None else None
        suffix = f"_b{request.branch}" if request.branch else ""
        if request.handoff_requested and not _is_handoff(upcoming):
            return _handoff_turn(last, suffix, chose)
        if leaf is None:
            raise ScriptExhausted(
                f"the script ran out after {len(self.plan.flat)} turns without the run finishing"
            )
        index = leaf.index
        delay = self.delay * float(upcoming.get("delay_factor", 1))
        if delay:
            time.sleep(delay)
        content: list[dict[str, Any]] = []
        if upcoming.get("text"):
            content.append({"type": "text", "text": upcoming["text"]})
        for j, call in enumerate(upcoming.get("tool_calls", [])):
            content.append(
                {
                    "type": "tool_use",
                    "id": f"toolu_scripted_{index}_{j}{suffix}",
                    "name": call["name"],
                    "input": call.get("input", {}),
                }
            )
        # Offline, tokens are estimated (4 characters a token) so session limits and token
        # budgets behave as they would online; the cost is zero.
        out_chars = sum(len(json.dumps(b)) for b in content)
        usage = Usage(
            input_tokens=int(
                upcoming.get("usage", {}).get("input_tokens", request.input_chars // 4)
            ),
            output_tokens=int(upcoming.get("usage", {}).get("output_tokens", out_chars // 4)),
        )
        has_calls = any(b["type"] == "tool_use" for b in content)
        return Turn(
            content=content,
            stop_reason="tool_use" if has_calls else "end_turn",
            usage=usage,
            model=OFFLINE_MODEL,
            meta=_meta(index, chose, upcoming),
        )

    def judge(self, request: TurnRequest) -> Turn:
        """Play the script's next `judge` verdict (the judge is a separate call, with its own
        place in the script)."""
        index = request.previous_meta.get("judge_index", -1) + 1
        verdicts = self.script.get("judge", [])
        if index >= len(verdicts):
            raise ScriptExhausted(f"the script has no judge verdict left (it has {len(verdicts)})")
        return Turn(
            content=[
                {
                    "type": "tool_use",
                    "id": f"toolu_scripted_judge_{index}",
                    "name": "verdict",
                    "input": verdicts[index],
                }
            ],
            stop_reason="tool_use",
            usage=Usage(),
            model=OFFLINE_MODEL,
            meta={"judge_index": index},
        )


def _meta(index: int, chose: list[dict[str, Any]], turn: dict[str, Any]) -> dict[str, Any]:
    """Where the agent is; what it chose on the way (only then, so a script without branch
    points records what it always did)."""
    meta: dict[str, Any] = {"script_index": index}
    if chose:
        meta["chose"] = chose
    if "delay_factor" in turn:
        meta["delay_factor"] = turn["delay_factor"]
    return meta


def _is_handoff(turn: dict[str, Any] | None) -> bool:
    return bool(turn) and any(c.get("name") == "handoff" for c in turn.get("tool_calls", []))
