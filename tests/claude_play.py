"""Claude Code's side of a conversation, played by the fake Messages API (tests/fake_anthropic.py)
as a process of its own: run it where the real CLI can reach it (inside a test's network
namespace).

    python tests/claude_play.py SCRIPT.json PORT_FILE

SCRIPT.json is a list of steps, each a Message's `content` (text and tool_use blocks; a step
ending in a tool_use block stops for the tool). Each request of Claude Code's main loop (one that
offers tools) gets the next step; any other request (a title, a summary) a short text. Every
request is appended to SCRIPT.json's `.requests.jsonl` neighbour, for the test to read. The
port it serves on is written to PORT_FILE.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fake_anthropic import FakeAnthropic


def main() -> None:
    script_path, port_file = Path(sys.argv[1]), Path(sys.argv[2])
    steps: list[list[dict[str, Any]]] = json.loads(script_path.read_text())
    log = script_path.with_suffix(".requests.jsonl")
    lock = threading.Lock()
    served = {"main": 0}

    def respond(request: dict[str, Any]) -> dict[str, Any]:
        body = request.get("body") or {}
        with lock:
            with log.open("a") as f:
                f.write(json.dumps(body) + "\n")
            if not body.get("tools"):
                return fake.message_body([{"type": "text", "text": "Claude Code test"}])
            index = served["main"]
            served["main"] += 1
        content = steps[index] if index < len(steps) else [{"type": "text", "text": "Done."}]
        stop = "tool_use" if content and content[-1].get("type") == "tool_use" else "end_turn"
        return fake.message_body(
            content, stop_reason=stop, usage={"input_tokens": 1000, "output_tokens": 50}
        )

    fake = FakeAnthropic(responder=respond)
    fake.start()
    port_file.write_text(str(fake.port or fake.base_url.rsplit(":", 1)[1]))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    fake.stop()


if __name__ == "__main__":
    main()
