"""A local fake of Slack's Web API, served over real HTTP, for slack_sdk's WebClient
(`base_url=fake.base_url`). It records every call (`calls`: method name, headers, parsed body)
and answers as Slack does: chat.postMessage with a new `ts` and the channel (a user id's
`unknown_users` refused with user_not_found), chat.update, chat.postEphemeral and views.open
with ok. `fail(n)` makes the next n calls answer HTTP 500.

It also signs interaction payloads as Slack would (`signed`), for the tests to send to the real
endpoint.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode

# The app's signing secret and bot token the tests configure (tests/conftest.py's `slack`).
SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
TOKEN = "xoxb-test-token-0123456789"


class FakeSlack:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.failing = 0
        # Ids Slack knows no one by: a message to one is refused (user_not_found).
        self.unknown_users: set[str] = set()
        self._lock = threading.Lock()
        self._ts = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/api/"

    def fail(self, times: int) -> None:
        self.failing = times

    def of(self, method: str) -> list[dict[str, Any]]:
        return [c["body"] for c in self.calls if c["method"] == method]

    def reset(self) -> None:
        with self._lock:
            self.calls.clear()
            self.failing = 0
            self.unknown_users = set()

    def _answer(self, method: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if self.failing:
                self.failing -= 1
                return 500, {"ok": False, "error": "internal_error"}
        if method == "chat.postMessage" and body.get("channel") in self.unknown_users:
            return 200, {"ok": False, "error": "user_not_found"}
        if method == "chat.postMessage":
            return 200, {
                "ok": True,
                "channel": "C" + str(body.get("channel", "")).lstrip("#").upper(),
                "ts": f"1700000000.{next(self._ts):06d}",
            }
        if method in ("chat.update", "chat.postEphemeral", "views.open"):
            return 200, {"ok": True, "channel": body.get("channel"), "ts": body.get("ts")}
        return 200, {"ok": False, "error": "unknown_method"}

    def __enter__(self) -> FakeSlack:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    body = json.loads(raw or "{}")
                else:
                    body = dict(parse_qsl(raw))
                method = self.path.rsplit("/", 1)[-1]
                with fake._lock:
                    fake.calls.append(
                        {
                            "method": method,
                            "headers": {k.lower(): v for k, v in self.headers.items()},
                            "body": body,
                        }
                    )
                status, answer = fake._answer(method, body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def signed(payload: dict[str, Any], secret: str, *, at: float | None = None) -> dict[str, Any]:
    """The body and headers Slack would send for this interaction payload, signed with the
    app's signing secret at `at` (now by default): keyword arguments for Django's test client
    or `requests`-like calls."""
    from slack_sdk.signature import SignatureVerifier

    body = urlencode({"payload": json.dumps(payload)})
    timestamp = str(int(at if at is not None else time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=timestamp, body=body)
    return {
        "data": body,
        "content_type": "application/x-www-form-urlencoded",
        "headers": {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": signature},
    }
