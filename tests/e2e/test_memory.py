"""Memory and the wake-up inspector in a real browser against a real `serve`: a run whose agent
remembered something in its first session; its second session's wake-up opens in the run page,
part by part with estimated tokens and what changed since the first; a person edits the memory
entry and the change is an event naming them."""

from __future__ import annotations

import os

import pytest

from agents import memory
from agents.models import Event, EventKind
from tests.e2e.helpers import CHROMIUM, log_in, screenshot, serving, wait_js
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_the_wake_up_inspector_and_editing_a_memory_entry(pages, eve, tmp_path, shots):
    # Driven to its end here, before the server starts: its workers have nothing to pick up.
    run = drive_until_idle(
        make_run(
            created_by=eve,
            project="shop",
            turns=[
                {"tool_calls": [call("remember", key="deps", text="run make deps first")]},
                {"tool_calls": [call("handoff", summary="half way there")]},
                finish_turn(),
            ],
        )
    )
    assert run.status == "succeeded", run.status_reason
    with serving(tmp_path) as base:
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")

        # Session 2's wake-up, in the run page: its parts, their sizes, what is new since 1.
        page.click("#sessions li:nth-child(2) a.wake-up-link")
        page.wait_for_selector("#wake-up[data-session='2']")
        inspector = page.locator("#wake-up-view")
        assert "Session 2: what it knew at wake-up" in inspector.inner_text()
        assert "(estimate)" in page.inner_text("#wake-up-goal .tokens")
        memory_part = page.locator("#wake-up-memory")
        assert "new" in memory_part.inner_text()
        assert "deps: run make deps first" in memory_part.inner_text()
        assert "half way there" in page.inner_text("#wake-up-handoff .wake-up-diff")
        assert "unchanged" in page.inner_text("#wake-up-goal")
        screenshot(page, "#wake-up-view", shots / "wake-up.png")

        # A person edits the entry from the Memory panel.
        entry = page.locator("#memory .memory-entry[data-key='deps']")
        entry.locator("details.memory-edit summary").click()
        entry.locator("textarea[name='text']").fill("run make deps, then make test")
        entry.locator("button[value='save']").click()
        wait_js(
            page,
            "document.querySelector('#memory .memory-text')?.textContent"
            ".includes('then make test')",
        )
        # (The notice may already be gone: the event's push re-renders the panel live.)
        screenshot(page, "#memory", shots / "memory.png")
        assert "last changed by user:eve" in page.inner_text("#memory")
    changed = Event.objects.get(run=run, kind=EventKind.MEMORY_CHANGED)
    assert changed.actor == "user:eve"
    assert changed.payload["text"] == "run make deps, then make test"
    assert memory.run_entries(run.pk)[0].text == "run make deps, then make test"
