"""What the browser tests share: the browser's flags, a real `manage.py serve` to test against,
and the steps every test takes (log in, start the demo)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

from agents.models import Run
from tests.procs import dying_with_us, process_env, wait_for
from tests.test_serve import free_port

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
