"""Runs examples/openai_agents/agent.py against a local fake of the OpenAI Responses API over
real HTTP: the SDK's own OpenAI model and client, pointed at a loopback server by
OPENAI_BASE_URL (the SDK's provider reads it), answering from a script. A test's subprocess,
never imported by the tests (the SDK's package is named `agents`, like Shiftlog's app).

    python tests/openai_agents_scripted.py SCRIPT.json INPUTS.json -- <the example's arguments>

SCRIPT.json lists the model's replies in order: {"text": …} or {"call": name, "args": {…}}, each
with optional "usage": {"input_tokens", "output_tokens"}. Each request's input is appended to
INPUTS.json, for the test to read what the model was told."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "openai_agents" / "agent.py"


class FakeResponses(ThreadingHTTPServer):
    """POST /v1/responses: the next scripted reply as a Responses API `response` object."""

    daemon_threads = True

    def __init__(self, script: Path, inputs: Path) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.replies = json.loads(script.read_text())
        self.inputs = inputs
        self.seen: list[Any] = []
        self.lock = threading.Lock()

    def reply(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.seen.append(body.get("input"))
            self.inputs.write_text(json.dumps(self.seen, default=str))
            if not self.replies:
                return 500, {"error": {"message": "the script has no reply left"}}
            n, reply = len(self.seen), self.replies.pop(0)
        if "call" in reply:
            out = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}",
                   "name": reply["call"], "arguments": json.dumps(reply["args"]),
                   "status": "completed"}  # fmt: skip
        else:
            text = {"type": "output_text", "text": reply["text"], "annotations": []}
            out = {"type": "message", "id": f"msg_{n}", "role": "assistant",
                   "status": "completed", "content": [text]}  # fmt: skip
        used = {"input_tokens": 10, "output_tokens": 5, **reply.get("usage", {})}
        return 200, {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": body.get("model", "gpt-5-mini"),
            "status": "completed",
            "output": [out],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                **used,
                "total_tokens": used["input_tokens"] + used["output_tokens"],
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }


class _Handler(BaseHTTPRequestHandler):
    server: FakeResponses

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        if self.path.rstrip("/") != "/v1/responses" or body.get("stream"):
            status, answer = 404, {"error": {"message": f"not faked: {self.path}"}}
        else:
            status, answer = self.server.reply(body)
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


def main() -> int:
    script, inputs, sep, *rest = sys.argv[1:]
    assert sep == "--", sys.argv
    fake = FakeResponses(Path(script), Path(inputs))
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    os.environ.update(
        OPENAI_BASE_URL=f"http://127.0.0.1:{fake.server_port}/v1",
        OPENAI_API_KEY="sk-fake-for-the-loopback-server",
        # The SDK's traces go to OpenAI's servers; there are none to reach here.
        OPENAI_AGENTS_DISABLE_TRACING="1",
    )
    spec = importlib.util.spec_from_file_location("openai_agents_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    try:
        return example.main(rest)
    finally:
        fake.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
