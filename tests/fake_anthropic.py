"""A local fake of the Anthropic Messages API, served over real HTTP.

The SDK's transport cannot be patched from outside (see FACTS.md), so tests point a real client
at this server instead. Queue the answers a test needs with `push*`, run the code, then read
`requests` to see what the client sent. A request with `"stream": true` gets the queued Message
as the API's stream of server-sent events (what the Claude Code CLI asks for).

    with FakeAnthropic() as fake:
        fake.push_message([{"type": "text", "text": "hi"}])
        client = anthropic.Anthropic(api_key="k", base_url=fake.base_url)

Run standalone (`python tests/fake_anthropic.py --port 8765`) it answers every request with a
short end_turn reply, for trying the worker by hand without an API key.
"""

from __future__ import annotations

import argparse
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeAnthropic:
    def __init__(
        self,
        *,
        port: int = 0,
        auto_reply: bool = False,
        responder: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    ) -> None:
        self.port = port
        # With a responder an empty queue asks it for the Message to answer a request with
        # (None: as without one): a script that plays an agent's side turn by turn.
        self.responder = responder
        # With auto_reply an empty queue answers end_turn instead of an error (standalone mode).
        self.auto_reply = auto_reply
        # Each entry: {"method", "path", "headers" (lower-case names), "body" (parsed JSON)}.
        self.requests: list[dict[str, Any]] = []
        self._responses: deque[tuple[int, Any, dict[str, str], float]] = deque()
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("FakeAnthropic is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    # -- scripting -----------------------------------------------------------------------------

    def push(
        self,
        body: dict[str, Any] | None = None,
        *,
        status: int = 200,
        headers: dict | None = None,
        delay: float = 0.0,
    ) -> None:
        """Queue one raw response; `body` None sends an empty body, `delay` stalls it (seconds)."""
        with self._lock:
            self._responses.append((status, body, dict(headers or {}), delay))

    def push_message(
        self,
        content: list[dict[str, Any]],
        *,
        stop_reason: str = "end_turn",
        model: str = "claude-sonnet-4-5",
        usage: dict[str, int] | None = None,
        delay: float = 0.0,
    ) -> None:
        """Queue a Message that passes the SDK's strict validation (`delay`: as in push)."""
        self.push(
            self.message_body(content, stop_reason=stop_reason, model=model, usage=usage),
            delay=delay,
        )

    def push_error(
        self, status: int, message: str, err_type: str, *, headers: dict | None = None
    ) -> None:
        """Queue an API error in the API's shape: {"type": "error", "error": {type, message}}."""
        self.push(
            {"type": "error", "error": {"type": err_type, "message": message}},
            status=status,
            headers=headers,
        )

    def message_body(
        self,
        content: list[dict[str, Any]],
        *,
        stop_reason: str = "end_turn",
        model: str = "claude-sonnet-4-5",
        usage: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        return {
            "id": f"msg_fake_{next(self._ids):04d}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 10,
                "output_tokens": 5,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                **(usage or {}),
            },
        }

    @property
    def pending(self) -> int:
        """Responses queued but not yet served."""
        with self._lock:
            return len(self._responses)

    # -- serving -------------------------------------------------------------------------------

    def _next_response(self, request: dict[str, Any]) -> tuple[int, Any, dict[str, str], float]:
        with self._lock:
            self.requests.append(request)
            if self._responses:
                return self._responses.popleft()
        if self.responder is not None and (answer := self.responder(request)) is not None:
            return 200, answer, {}, 0.0
        if self.auto_reply:
            model = (request.get("body") or {}).get("model", "claude-sonnet-4-5")
            return 200, self.message_body([{"type": "text", "text": "ok"}], model=model), {}, 0.0
        # Tell the SDK not to retry: a test that ran out of script should fail at once, not
        # after several backoff sleeps.
        error = {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": f"FakeAnthropic script ran out of responses (request {len(self.requests)})",
            },
        }
        return 500, error, {"x-should-retry": "false"}, 0.0

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw else None
                except ValueError:
                    body = raw.decode("utf-8", "replace")
                status, payload, headers, delay = fake._next_response(
                    {
                        "method": "POST",
                        "path": self.path,
                        "headers": {name.lower(): value for name, value in self.headers.items()},
                        "body": body,
                    }
                )
                if delay:
                    time.sleep(delay)
                if (
                    status == 200
                    and isinstance(body, dict)
                    and body.get("stream")
                    and isinstance(payload, dict)
                    and payload.get("type") == "message"
                ):
                    self._stream(payload, headers)
                    return
                data = b"" if payload is None else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up waiting (timeout tests); nothing to tell it

            def _stream(self, message: dict[str, Any], headers: dict[str, str]) -> None:
                """A queued Message sent as the API streams one (`"stream": true`)."""
                try:
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.send_header("cache-control", "no-cache")
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    for event in stream_events(message):
                        frame = f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
                        self.wfile.write(frame.encode())
                    self.wfile.flush()
                    self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output clean

        return Handler

    def start(self) -> FakeAnthropic:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            # A short poll keeps stop() quick: shutdown() waits for the loop to notice.
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name="fake-anthropic",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = None
        self._thread = None

    def __enter__(self) -> FakeAnthropic:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A Message as the Messages API's stream of events: message_start, each content block as
    start, delta(s) and stop, message_delta (stop reason and output usage), message_stop."""
    usage = dict(message.get("usage") or {})
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {**usage, "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for index, block in enumerate(message.get("content") or []):
        if block.get("type") == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            delta = {"type": "text_delta", "text": block.get("text", "")}
        elif block.get("type") == "tool_use":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "input": {}},
                }
            )
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block.get("input", {}))}
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
            delta = None
        if delta is not None:
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {
                "stop_reason": message.get("stop_reason"),
                "stop_sequence": message.get("stop_sequence"),
            },
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        }
    )
    events.append({"type": "message_stop"})
    return events


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve a fake Anthropic Messages API.")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    fake = FakeAnthropic(port=args.port, auto_reply=True).start()
    print(f"Fake Anthropic API at {fake.base_url} (Ctrl-C to stop)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()


if __name__ == "__main__":
    main()
