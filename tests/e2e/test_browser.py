"""End to end in a real headless Chromium (Debian's, driven by the playwright package) against
real servers: `manage.py serve`, and daphne plus a huey consumer that the test kills and restarts.

Set SHIFTLOG_SCREENSHOTS=DIR to keep the screenshots (the README's come from here).
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

from agents.models import Run, RunStatus
from tests.e2e.helpers import (
    CHROMIUM,
    dom_seqs,
    free_port,
    log_in,
    serving,
    start_demo,
    status_of,
    wait_http,
    wait_js,
)
from tests.procs import Procs, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_log_in_start_the_demo_watch_it_live_and_approve_the_waiting_step(
    pages, eve, tmp_path, shots
):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.25") as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        # Events arrive without a reload, and the risky step waits inline with its buttons.
        wait_js(
            page, "document.querySelectorAll('#events [data-seq]').length >= 10", timeout=30_000
        )
        approve = page.wait_for_selector(
            ".approval.a-pending button[value=approve]", timeout=60_000
        )
        # The header comes with the run's status change, a push after the card's.
        wait_js(
            page,
            "document.querySelector('#run-header').innerText.toLowerCase()"
            ".includes('awaiting approval')",
        )
        assert "scripted · offline" in page.inner_text("#run-header")
        # The count comes by the runs stream, a moment after the card (its own push).
        wait_js(page, "document.querySelector('#approval-count').textContent.trim() === '1'")
        page.screenshot(path=str(shots / "run-awaiting-approval.png"))
        inbox = page.context.new_page()
        inbox.goto(f"{base}/approvals/")
        assert "rm -rf build" in inbox.inner_text("#approval-list")
        inbox.screenshot(path=str(shots / "approvals.png"))
        inbox.close()
        approve.click()
        page.wait_for_selector(".approval.a-approved", timeout=10_000)
        wait_js(
            page,
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase() === 'succeeded'",
            timeout=60_000,
        )
        assert page.evaluate("window.__notReloaded") is True
        last = Run.objects.get(pk=run_id).last_seq
        wait_js(page, f"document.querySelector('#events [data-seq=\"{last}\"]') !== null")
        assert dom_seqs(page) == list(range(1, last + 1))
        wait_js(page, "document.querySelector('#approval-count').textContent.trim() === '0'")
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
    """Pause the run at its risky step, approve the step, and rewind to session 1's checkpoint
    from the timeline: the confirm panel says what goes, the old branch is marked, the replay
    arrives live, and the replayed risky step waits for a person again."""
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.25") as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        page.wait_for_selector(".approval.a-pending button[value=approve]", timeout=90_000)
        # Paused, the run stays paused once its step is approved: nothing runs until a person
        # resumes it (or, here, rewinds it).
        page.click("#run-header button:has-text('Pause')")
        wait_js(
            page,
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'paused'",
            timeout=30_000,
        )
        page.click(".approval.a-pending button[value=approve]")
        page.wait_for_selector(".approval.a-approved", timeout=10_000)
        assert status_of(run_id) == RunStatus.PAUSED
        target = Run.objects.get(pk=run_id).checkpoints.get(kind="session_end")
        page.click(f"#checkpoint-{target.number} a:has-text('Rewind')")
        panel = page.wait_for_selector("#checkpoint-action #confirm-panel", timeout=10_000)
        text = panel.inner_text()
        assert f"Rewind run {run_id} to checkpoint {target.number}?" in text
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
        wait_js(
            page,
            f"[...document.querySelectorAll('#events [data-seq]')].some(e => +e.dataset.seq > {rewound_seq} && e.classList.contains('session-started'))",
            timeout=60_000,
        )
        page.click(".approval.a-pending button[value=approve]", timeout=90_000)
        wait_js(
            page,
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'succeeded'",
            timeout=90_000,
        )
        assert page.evaluate("window.__notReloaded") is True
        last = Run.objects.get(pk=run_id).last_seq
        wait_js(
            page,
            f"document.querySelector('#events [data-seq=\"{last}\"]') !== null",
            timeout=20_000,
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
        page.goto(f"{base}/runs/{run_id}/diff/?a={first.number}&b={target.number}")
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
        "shiftlog.asgi:application",
    ]
    try:
        web = procs.spawn("daphne", daphne, env)
        procs.consumer(workers=2, SHIFTLOG_DEMO_TURN_DELAY="0.4")
        wait_http(f"{base}/accounts/login/")
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        page.evaluate("window.__notReloaded = true")
        wait_js(page, "document.querySelectorAll('#events [data-seq]').length >= 6", timeout=30_000)
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
        wait_js(
            page,
            f"document.querySelector('#events [data-seq=\"{last}\"]') !== null",
            timeout=20_000,
        )
        assert page.evaluate("window.__notReloaded") is True
        assert dom_seqs(page) == list(range(1, last + 1))  # no gap, no duplicate
    finally:
        procs.close()


def test_the_runs_list_row_follows_its_run_live_while_an_approval_waits(pages, eve, tmp_path):
    """A runs-list push that carries the header's approval count once put the count's <span>
    before the row's <tr> in one message: htmx parses a message in a <template>, where Chromium
    then dropped the row's <tr>/<td> tags, and the row was not updated (htmx:oobErrorNoTarget).
    Rows and the count now go in messages of their own (dashboard/live/frames.py)."""
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.25") as base:
        lister = pages()
        log_in(lister, base)
        lister.goto(f"{base}/")
        lost = []
        lister.on("console", lambda m: lost.append(m.text) if "oobErrorNoTarget" in m.text else 0)
        starter = pages()
        log_in(starter, base)
        run_id = start_demo(starter, base)
        row = f"document.querySelector('#run-{run_id} .run-status')"
        wait_js(lister, f"{row} !== null", timeout=20_000)
        starter.wait_for_selector(".approval.a-pending button[value=approve]", timeout=60_000)
        # The row says so live, beside the header's count, without a reload.
        wait_js(
            lister,
            f"{row}.textContent.toLowerCase().includes('awaiting approval')",
            timeout=10_000,
        )
        wait_js(lister, "document.querySelector('#approval-count').textContent.trim() === '1'")
        assert "1 waiting" in lister.inner_text(f"#run-{run_id}")
        assert lost == []
