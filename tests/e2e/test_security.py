"""The web surface against a hostile page, in a real browser: a page served from another port of
the same host, open in a logged-in supervisor's browser, can neither open the live socket nor read
a run through it."""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.e2e.helpers import CHROMIUM, log_in, serving, start_demo, wait_js
from tests.helpers import make_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.any_db,  # an origin check and a page's CSP: once, on SQLite
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]

# Opens the run's socket and records what happens, for the test to read.
PROBE = """
window.__probe = {opened: false, messages: [], closed: null};
const ws = new WebSocket(URL);
ws.onopen = () => { window.__probe.opened = true; };
ws.onmessage = (e) => { window.__probe.messages.push(e.data); };
ws.onclose = (e) => { window.__probe.closed = e.code; };
true;  // the script's value (evaluate would call a function left as its last value)
"""


class Elsewhere:
    """A page on another port of the same host, running PROBE against `url`."""

    def __init__(self, url: str) -> None:
        page = f"<!doctype html><title>elsewhere</title><script>{PROBE.replace('URL', repr(url))}</script>"

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = page.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_page_on_another_port_cannot_read_a_run_through_the_socket(pages, eve, tmp_path):
    run = make_run(created_by=eve, goal="secret goal: the launch codes")
    with serving(tmp_path) as base:
        page = pages()
        log_in(page, base)
        socket_url = base.replace("http://", "ws://") + f"/ws/live/runs/{run.pk}/?after=0"
        # A positive control: the app's own page opens the socket and reads the run.
        page.goto(f"{base}/")
        page.evaluate(PROBE.replace("URL", repr(socket_url)))
        wait_js(page, "window.__probe.messages.join('').includes('launch codes')")
        assert page.evaluate("window.__probe.opened") is True
        # The same browser, the same cookies, another port of the same host: refused.
        elsewhere = Elsewhere(socket_url)
        try:
            other = page.context.new_page()
            other.goto(elsewhere.url)
            wait_js(other, "window.__probe.closed !== null", timeout=10_000)
            probe = other.evaluate("window.__probe")
        finally:
            elsewhere.close()
        assert probe["opened"] is False and probe["messages"] == [], probe
        assert probe["closed"] != 1000  # refused at the handshake, not closed after a read


# Every violation of the page's Content-Security-Policy, reported to the test through the
# console (the browser refuses the thing either way; this makes the refusal visible).
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => {
  console.error("CSP-VIOLATION " + e.violatedDirective + " " + (e.blockedURI || "inline"));
});
"""


def test_the_pages_work_under_a_strict_csp_with_no_violation(pages, eve, tmp_path):
    """Log in, start the demo, watch it live, approve inline, open and close a checkpoint
    panel, see a diff, an artifact and the admin: every page carries the strict policy and
    nothing on them is refused by it."""
    from agents.models import Run

    violations: list[str] = []
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.2") as base:
        page = pages()
        page.add_init_script(REPORT_VIOLATIONS)
        page.on(
            "console",
            lambda m: violations.append(m.text) if "CSP-VIOLATION" in m.text else None,
        )
        response = page.goto(f"{base}/accounts/login/")
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy, policy
        assert "frame-ancestors 'none'" in policy
        assert response.headers["x-content-type-options"] == "nosniff"
        log_in(page, base)
        run_id = start_demo(page, base)
        page.click(".approval.a-pending button[value=approve]", timeout=90_000)  # htmx swap
        page.wait_for_selector(".approval.a-approved", timeout=10_000)
        wait_js(  # live updates over the socket
            page,
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'succeeded'",
            timeout=90_000,
        )
        first = Run.objects.get(pk=run_id).checkpoints.order_by("seq").first()
        page.click(f"#checkpoint-{first.number} a:has-text('Fork')")
        page.wait_for_selector("#checkpoint-action #confirm-panel", timeout=10_000)
        page.click("#checkpoint-action [data-close-panel]")  # the moved-out onclick
        wait_js(page, "document.querySelector('#checkpoint-action').innerHTML === ''")
        assert page.url.endswith(f"/runs/{run_id}/")
        page.goto(f"{base}/runs/{run_id}/diff/?a={first.number}&b=live")
        page.wait_for_selector(".file-diff")
        page.goto(f"{base}/runs/{run_id}/")
        page.click("#artifacts li:has-text('textstats.py') >> a >> nth=0")
        page.wait_for_selector(".viewer .hl")
        page.goto(f"{base}/approvals/")
        page.goto(f"{base}/runs/new/?demo=1")
        page.goto(f"{base}/admin/")
    assert violations == []
