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
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from agents import inputs, schemas
from agents.providers.base import ScriptExhausted, Turn, TurnRequest, Usage

SCRIPTS_DIR = Path(__file__).resolve().parent.parent / "scripts"
OFFLINE_MODEL = "scripted"


class ScriptError(ValueError):
    """A script that cannot be played; the message says where and why."""


def validate_script(script: Any) -> dict[str, Any]:
    """The script, if it is one (agents/schemas/script.schema.json); else ScriptError saying
    where it is wrong. A script that passes cannot crash the runtime later."""
    problem = schemas.first_error("script", script)
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


def _handoff_turn(script_index: int, suffix: str) -> Turn:
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
        meta={"script_index": script_index, "synthesized": "handoff"},
    )


class ScriptedProvider:
    name = "scripted"
    offline = True

    def __init__(self, script: dict[str, Any]):
        self.script = validate_script(script)
        self.turns = self.script["turns"]
        self.delay = float(self.script.get("turn_delay_seconds", 0))

    def next_turn(self, request: TurnRequest) -> Turn:
        # script_index in meta is the index of the last turn played (-1: none yet).
        last = request.previous_meta.get("script_index", -1)
        index = last + 1
        suffix = f"_b{request.branch}" if request.branch else ""
        upcoming = self.turns[index] if index < len(self.turns) else None
        if request.handoff_requested and not _is_handoff(upcoming):
            return _handoff_turn(last, suffix)
        if upcoming is None:
            raise ScriptExhausted(
                f"the script ran out after {len(self.turns)} turns without the run finishing"
            )
        if self.delay:
            time.sleep(self.delay)
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
            meta={"script_index": index},
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


def _is_handoff(turn: dict[str, Any] | None) -> bool:
    return bool(turn) and any(c.get("name") == "handoff" for c in turn.get("tool_calls", []))
