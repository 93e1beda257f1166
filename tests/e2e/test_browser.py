"""End to end in a real headless Chromium (Debian's, driven by the playwright package) against
real servers: `manage.py serve`, and daphne plus a huey consumer that the test kills and restarts.

Set SHIFTLOG_SCREENSHOTS=DIR to keep the screenshots (the README's come from here).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from agents.models import Run, RunStatus
from tests.procs import Procs, process_env, wait_for
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

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


@pytest.fixture
def browser(monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are
    # plain synchronous code all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def pages(browser, tmp_path):
    """New pages; each one's last state is kept as tmp_path/last-N.png, to look at after a failure."""
    made = []

    def new_page():
        page = browser.new_context(viewport={"width": 1360, "height": 900}).new_page()
        made.append(page)
        return page

    yield new_page
    for i, page in enumerate(made):
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp_path / f"last-{i}.png"), full_page=True)


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("SHIFTLOG_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def eve(db):
    from django.test import override_settings

    # The servers use the real password hashers, not the tests' fast one.
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.PBKDF2PasswordHasher"]):
        user = get_user_model().objects.create_user("eve", password="pw-eve-12345")
    for codename in ("decide_approval", "view_run", "control_run"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


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
    page.wait_for_url(f"{base}/")


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
        [sys.executable, "manage.py", "serve", "--port", str(port), "--workers", "2"],
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


def test_log_in_start_the_demo_watch_it_live_and_approve_the_waiting_step(
    pages, eve, tmp_path, shots
):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.25") as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        # Events arrive without a reload, and the risky step waits inline with its buttons.
        page.wait_for_function(
            "document.querySelectorAll('#events [data-seq]').length >= 10", timeout=30_000
        )
        approve = page.wait_for_selector(
            ".approval.a-pending button[value=approve]", timeout=60_000
        )
        assert "awaiting approval" in page.inner_text("#run-header").lower()
        assert "scripted · offline" in page.inner_text("#run-header")
        assert page.inner_text("#approval-count") == "1"
        page.screenshot(path=str(shots / "run-awaiting-approval.png"))
        inbox = page.context.new_page()
        inbox.goto(f"{base}/approvals/")
        assert "rm -rf build" in inbox.inner_text("#approval-list")
        inbox.screenshot(path=str(shots / "approvals.png"))
        inbox.close()
        approve.click()
        page.wait_for_selector(".approval.a-approved", timeout=10_000)
        page.wait_for_function(
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase() === 'succeeded'",
            timeout=60_000,
        )
        assert page.evaluate("window.__notReloaded") is True
        last = Run.objects.get(pk=run_id).last_seq
        page.wait_for_function(f"document.querySelector('#events [data-seq=\"{last}\"]') !== null")
        assert dom_seqs(page) == list(range(1, last + 1))
        assert page.inner_text("#approval-count") == "0"
        page.screenshot(path=str(shots / "run-succeeded.png"), full_page=True)
        page.goto(f"{base}/")
        assert "succeeded" in page.inner_text(f"#run-{run_id}").lower()
        page.screenshot(path=str(shots / "runs-list.png"))
        page.goto(f"{base}/runs/{run_id}/")
        page.click("#artifacts li:has-text('textstats.py') >> a >> nth=0")
        page.wait_for_selector(".viewer .hl")
        page.screenshot(path=str(shots / "artifact.png"))
        page.goto(f"{base}/runs/new/?demo=1")
        page.screenshot(path=str(shots / "new-run.png"), full_page=True)


def test_approve_pause_then_rewind_from_the_timeline_and_the_run_continues_live(
    pages, eve, tmp_path, shots
):
    """Approve the risky step, pause, and rewind to session 1's checkpoint from the timeline: the
    confirm panel says what goes, the old branch is marked, the replay arrives live, and the
    replayed risky step waits for a person again."""
    # Slow enough turns that a person can pause the run after the approval.
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="3") as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        page.click(".approval.a-pending button[value=approve]", timeout=90_000)
        page.wait_for_selector(".approval.a-approved", timeout=10_000)
        page.click("#run-header button:has-text('Pause')")
        page.wait_for_function(
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'paused'",
            timeout=30_000,
        )
        target = Run.objects.get(pk=run_id).checkpoints.get(kind="session_end")
        page.click(f"#checkpoint-{target.pk} a:has-text('Rewind')")
        panel = page.wait_for_selector("#checkpoint-action #confirm-panel", timeout=10_000)
        text = panel.inner_text()
        assert f"Rewind run {run_id} to checkpoint #{target.seq}?" in text
        assert "Would discard" in text and "Sessions started after it: 2" in text, text
        assert "textstats.py" in text and "tool.call" in text, text
        assert status_of(run_id) == RunStatus.PAUSED, "showing the panel changed nothing"
        page.fill("#confirm-panel textarea[name=note]", "go carefully with rm")
        page.screenshot(path=str(shots / "checkpoint-rewind-confirm.png"), full_page=True)
        page.click("#confirm-panel button.confirm-rewind")
        page.wait_for_selector(".confirm.done", timeout=30_000)
        rewound = page.wait_for_selector(".ev.run-rewound", timeout=20_000)
        rewound_seq = int(rewound.get_attribute("data-seq"))
        # The branch left behind is marked live, without a reload.
        page.wait_for_selector(".ev.abandoned .abandoned-badge", timeout=10_000)
        # The replay arrives live: session 3, then the risky step waits for a person again.
        page.wait_for_function(
            f"[...document.querySelectorAll('#events [data-seq]')].some(e => +e.dataset.seq > {rewound_seq} && e.classList.contains('session-started'))",
            timeout=60_000,
        )
        page.click(".approval.a-pending button[value=approve]", timeout=90_000)
        page.wait_for_function(
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'succeeded'",
            timeout=90_000,
        )
        assert page.evaluate("window.__notReloaded") is True
        last = Run.objects.get(pk=run_id).last_seq
        page.wait_for_function(
            f"document.querySelector('#events [data-seq=\"{last}\"]') !== null", timeout=20_000
        )
        seqs = dom_seqs(page)
        assert seqs == list(range(seqs[0], last + 1))  # no gap, no duplicate
        abandoned = page.eval_on_selector_all(
            "#events .ev.abandoned", "els => els.map(e => parseInt(e.dataset.seq, 10))"
        )
        assert abandoned and all(target.seq < s < rewound_seq for s in abandoned)
        assert "abandoned by rewind" in page.inner_text("#checkpoints")  # the old pre-approval one
        page.screenshot(path=str(shots / "run-rewound.png"))
        first = Run.objects.get(pk=run_id).checkpoints.get(kind="run_start")
        page.goto(f"{base}/runs/{run_id}/diff/?a={first.pk}&b={target.pk}")
        page.wait_for_selector(".file-diff pre.diff .add")
        assert "textstats.py" in page.inner_text("#diff-summary")
        page.screenshot(path=str(shots / "checkpoint-diff.png"), full_page=True)


def test_killing_daphne_mid_stream_loses_and_doubles_nothing(pages, eve, tmp_path, shots):
    procs = Procs(tmp_path)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = procs.env(SHIFTLOG_DEMO_TURN_DELAY="0.4")
    daphne = [
        sys.executable,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "dashboard.asgi:application",
    ]
    try:
        web = procs.spawn("daphne", daphne, env)
        procs.consumer(workers=2, SHIFTLOG_DEMO_TURN_DELAY="0.4")
        wait_http(f"{base}/accounts/login/")
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        page.wait_for_function(
            "document.querySelectorAll('#events [data-seq]').length >= 6", timeout=30_000
        )
        held = Run.objects.get(pk=run_id).last_seq
        web.signal(signal.SIGKILL)
        web.wait(10)
        page.wait_for_selector("#live-state.retry", timeout=10_000)
        # The worker goes on writing while no web server is up.
        wait_for(
            lambda: Run.objects.get(pk=run_id).last_seq >= held + 4, timeout=30, what="more events"
        )
        procs.spawn("daphne", daphne, env)
        wait_http(f"{base}/accounts/login/")
        page.wait_for_selector("#live-state.on", timeout=30_000)
        wait_for(
            lambda: status_of(run_id) == RunStatus.AWAITING_APPROVAL,
            timeout=60,
            what="the approval",
        )
        # The approval arrived through the restarted server: decide it in the page.
        page.click(".approval.a-pending button[value=approve]", timeout=20_000)
        wait_for(
            lambda: status_of(run_id) == RunStatus.SUCCEEDED,
            timeout=60,
            what="success",
            details=procs.logs,
        )
        last = Run.objects.get(pk=run_id).last_seq
        page.wait_for_function(
            f"document.querySelector('#events [data-seq=\"{last}\"]') !== null", timeout=20_000
        )
        assert page.evaluate("window.__notReloaded") is True
        assert dom_seqs(page) == list(range(1, last + 1))  # no gap, no duplicate
    finally:
        procs.close()
