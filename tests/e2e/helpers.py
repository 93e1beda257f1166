"""What the browser tests share: the browser's flags and marks, a real `manage.py serve` to test
against, the steps every test takes (log in, start the demo), and the outside world some tests
need on loopback (an SMTP server keeping what it receives, Slack's signed callbacks)."""

from __future__ import annotations

import contextlib
import email
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from email import policy

import pytest

from agents.models import Run
from tests.procs import dying_with_us, free_port, process_env, wait_for

CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


# The marks of a browser test against a real serve: slow, UI only, a database the server shares,
# a generous timeout, and skipped without Chromium.
BROWSER_TEST = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def wait_js(page, expression: str, timeout: float = 30_000) -> None:
    """Wait until a JavaScript expression is truthy in the page. Playwright's own
    wait_for_function evaluates its predicate with eval, which the pages' Content-Security-Policy
    (rightly) refuses; page.evaluate goes through the debugging protocol, which it does not."""
    deadline = time.monotonic() + timeout / 1000
    while not page.evaluate(f"() => Boolean({expression})"):
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout / 1000:g} s waiting for {expression}")
        page.wait_for_timeout(50)


def screenshot(page, selector: str, path) -> None:
    """Screenshot the element a selector names. A live panel can be swapped for its new render
    (an htmx answer, then the socket's push of the same event) while Playwright waits for it to
    be stable; the old element is then detached, so look the selector up again and retry."""
    for attempt in range(5):
        try:
            page.locator(selector).screenshot(path=str(path))
            return
        except Exception as error:  # playwright's Error; its message says why
            if "not attached" not in str(error) or attempt == 4:
                raise
            page.wait_for_timeout(100)


def wait_http(url: str, timeout: float = 30) -> None:
    def up():
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    wait_for(up, timeout=timeout, what=f"{url} to answer", interval=0.2)


def log_in(page, base: str) -> None:
    page.goto(f"{base}/accounts/login/")
    page.fill("#id_username", "eve")
    page.fill("#id_password", "pw-eve-12345")
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/overview/")  # a person lands on the Overview


def start_demo(page, base: str) -> int:
    page.goto(f"{base}/runs/new/?demo=1")
    page.click("button:has-text('Start run')")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    page.wait_for_selector("#live-state.on")
    return int(page.url.rstrip("/").rsplit("/", 1)[1])


def dom_seqs(page) -> list[int]:
    return page.eval_on_selector_all(
        "#events [data-seq]", "els => els.map(e => parseInt(e.dataset.seq, 10))"
    )


def status_of(run_id: int) -> str:
    return Run.objects.filter(pk=run_id).values_list("status", flat=True).first()


def serve_env(tmp_path, **extra) -> dict[str, str]:
    env = process_env(tmp_path)
    env.update(
        {
            "SHIFTLOG_REQUEUE_AFTER_SECONDS": "2",
            "SHIFTLOG_REAPER_INTERVAL": "1",
            "SHIFTLOG_HUEY_IMMEDIATE": "false",
        }
    )
    env.update({k: str(v) for k, v in extra.items()})
    return env


@contextlib.contextmanager
def serving(tmp_path, **env):
    """A real `manage.py serve` (daphne, a huey consumer, the reaper) on the test's database;
    yields its base URL and stops it the way Ctrl-C does."""
    port = free_port()
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        dying_with_us(
            [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"]
        ),
        env=serve_env(tmp_path, **env),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/accounts/login/")
        yield base
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


class Mailbox:
    """What an SMTP server on loopback (aiosmtpd) received, as email messages."""

    def __init__(self) -> None:
        self.messages: list[email.message.EmailMessage] = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd's name
        self.messages.append(email.message_from_bytes(envelope.content, policy=policy.default))
        return "250 OK"

    def text_of(self, message) -> str:
        return message.get_body(("plain",)).get_content()


@contextlib.contextmanager
def smtp_server():
    """A real SMTP server on a free loopback port (aiosmtpd, the dev extra): yields (port,
    Mailbox); `serving(..., **mail_env(port))` has Shiftlog mail it."""
    from aiosmtpd.controller import Controller

    mailbox = Mailbox()
    port = free_port()
    controller = Controller(mailbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, mailbox
    finally:
        controller.stop()


def mail_env(port: int) -> dict[str, str]:
    return {"SHIFTLOG_EMAIL_HOST": "127.0.0.1", "SHIFTLOG_EMAIL_PORT": str(port)}


def slack_env(slack, secret: str, channel: str = "C0OPS") -> dict[str, str]:
    """The environment that points a serve at a fake Slack (tests/fake_slack.py)."""
    return {
        "SHIFTLOG_SLACK_BOT_TOKEN": "xoxb-e2e",
        "SHIFTLOG_SLACK_SIGNING_SECRET": secret,
        "SHIFTLOG_SLACK_CHANNEL": channel,
        "SHIFTLOG_SLACK_API_URL": slack.base_url,
    }


def slack_callback(base: str, payload: dict, secret: str) -> int:
    """Send an interaction to the serve as Slack would (signed, over HTTP); its HTTP status."""
    from tests.fake_slack import signed

    request = signed(payload, secret)
    answer = urllib.request.urlopen(
        urllib.request.Request(
            f"{base}/slack/interactive",
            data=request["data"].encode(),
            headers={"Content-Type": request["content_type"], **request["headers"]},
        ),
        timeout=30,
    )
    return answer.status
