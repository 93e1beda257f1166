"""Runs examples/openai_agents/agent.py with a scripted model through the SDK's own custom-model
hook (an `agents.models.interface.Model`): a test's subprocess, never imported by the tests (the
SDK's package is named `agents`, like Shiftlog's app).

    python tests/openai_agents_scripted.py SCRIPT.json INPUTS.json -- <the example's arguments>

SCRIPT.json lists the model's replies in order: {"text": …} or {"call": name, "args": {…}}, each
with optional "usage": {"input_tokens", "output_tokens"}. Each request's input is appended to
INPUTS.json, for the test to read what the model was told."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai_agents" / "agent.py"


def _dump(item: Any) -> Any:
    return item.model_dump() if hasattr(item, "model_dump") else item


class ScriptedModel(Model):
    model = "scripted-gpt"

    def __init__(self, script: Path, inputs: Path) -> None:
        self.replies = json.loads(script.read_text())
        self.inputs = inputs
        self.seen: list[Any] = []

    async def get_response(self, system_instructions, input, *args, **kwargs) -> ModelResponse:
        self.seen.append(input if isinstance(input, str) else [_dump(i) for i in input])
        self.inputs.write_text(json.dumps(self.seen, default=str))
        if not self.replies:
            raise RuntimeError("the script has no reply left")
        n = len(self.seen)
        reply = self.replies.pop(0)
        if "call" in reply:
            out: Any = ResponseFunctionToolCall(type="function_call", id=f"fc_{n}",
                                                call_id=f"call_{n}", name=reply["call"],
                                                arguments=json.dumps(reply["args"]))  # fmt: skip
        else:
            text = ResponseOutputText(type="output_text", text=reply["text"], annotations=[])
            out = ResponseOutputMessage(type="message", id=f"msg_{n}", role="assistant",
                                        status="completed", content=[text])  # fmt: skip
        used = {"input_tokens": 10, "output_tokens": 5, **reply.get("usage", {})}
        usage = Usage(requests=1, total_tokens=used["input_tokens"] + used["output_tokens"], **used)
        return ModelResponse(output=[out], usage=usage, response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("the example does not stream")


def main() -> int:
    script, inputs, sep, *rest = sys.argv[1:]
    assert sep == "--", sys.argv
    spec = importlib.util.spec_from_file_location("openai_agents_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.main(rest, model=ScriptedModel(Path(script), Path(inputs)))


if __name__ == "__main__":
    raise SystemExit(main())
