"""A person's input mattering, in a real browser against a real `serve`: start the demo, deny
its risky step with a reason about keeping things through the approval card's form, and the run
succeeds having listed what it kept in a .gitignore instead of deleting it."""

from __future__ import annotations

import os

import pytest

from agents.models import Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, start_demo, wait_js

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def explain(page, run_id: int, tmp_path) -> None:
    """On a failure: what the database, the page and the server said (pytest shows it)."""
    run = Run.objects.get(pk=run_id)
    print("database:", run.status, run.status_reason)
    print("events:", list(run.events.order_by("seq").values_list("seq", "kind")))
    print("header:", page.evaluate("document.querySelector('#run-header')?.outerHTML"))
    print("server log:", (tmp_path / "serve.log").read_text()[-6000:])


def test_denying_the_cleanup_to_keep_the_cache_leaves_a_gitignore(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.1") as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        card = page.wait_for_selector(".approval.a-pending", timeout=90_000)
        assert "rm -rf build __pycache__" in card.inner_text()
        card.query_selector("input[name=reason]").fill("keep the cache")
        card.query_selector("button[value=deny]").click()
        page.wait_for_selector(".approval.a-denied", timeout=10_000)
        assert "keep the cache" in page.inner_text(".approval.a-denied")
        try:
            wait_js(
                page,
                "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
                " === 'succeeded'",
                timeout=90_000,
            )
        except AssertionError:
            explain(page, run_id, tmp_path)
            raise
        # The agent's answer arrived live: it wrote .gitignore and the checks passed.
        last = Run.objects.get(pk=run_id).last_seq
        wait_js(page, f"document.querySelector('#events [data-seq=\"{last}\"]') !== null")
        events = page.inner_text("#events")
        assert ".gitignore" in events
        page.screenshot(path=str(shots / "run-denied-to-keep.png"), full_page=True)
        # The diff from the run's start to the live workspace lists the new file.
        start = Run.objects.get(pk=run_id).checkpoints.get(kind="run_start")
        page.goto(f"{base}/runs/{run_id}/diff/?a={start.number}&b=live")
        summary = page.inner_text("#diff-summary")
        assert ".gitignore" in summary, summary
        gitignore = page.locator(".file-diff", has_text=".gitignore").inner_text()
        assert "build/" in gitignore and "__pycache__/" in gitignore
