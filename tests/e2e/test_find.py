"""Finding things in a run, in a real browser: the first failure in its context, a search by
text and failures, and a link to an event the run page does not hold."""

from __future__ import annotations

import os

import pytest

from agents.models import Event
from tests.e2e.helpers import CHROMIUM, log_in, serving, wait_js
from tests.e2e.test_defects import finished_demo

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_first_failure_search_and_deep_links(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = finished_demo(eve)
        failure = Event.objects.filter(run=run).failures().order_by("seq").first()
        assert failure is not None  # the demo calls finish before its tests pass
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")
        page.click("text=First failure")
        page.wait_for_url(f"**/runs/{run.pk}/events/{failure.seq}/#seq-{failure.seq}")
        target = page.locator(".ev.ev-target")
        assert target.count() == 1 and f"#{failure.seq}" in target.inner_text()
        # The marked event is scrolled into view.
        assert page.evaluate(
            f"(() => {{ const r = document.getElementById('seq-{failure.seq}')"
            ".getBoundingClientRect(); return r.top >= 0 && r.bottom <= window.innerHeight; })()"
        )
        page.screenshot(path=str(shots / "find-first-failure.png"))

        # A search: failed tool results that mention the module.
        page.goto(f"{base}/runs/{run.pk}/")
        page.click("text=Find events…")
        page.fill("input[name=q]", "textstats")
        page.check("input[name=errors]")
        page.click("button:has-text('Find')")
        page.wait_for_selector(".find-count")
        found = [int(s) for s in page.eval_on_selector_all(
            ".find-results [data-seq]", "els => els.map(e => e.dataset.seq)")]  # fmt: skip
        expected = list(
            Event.objects.filter(run=run)
            .matching(text="textstats", errors=True)
            .order_by("seq")
            .values_list("seq", flat=True)
        )
        assert found == expected and found
        page.screenshot(path=str(shots / "find-results.png"))

        # A link to the run's first event, which the run page (newest events) does not hold.
        assert run.last_seq > 50
        page.goto(f"{base}/runs/{run.pk}/#seq-1")
        page.wait_for_url(f"**/runs/{run.pk}/events/1/#seq-1")
        wait_js(page, "document.querySelector('.ev.ev-target #seq-1') !== null")
        # One it holds stays on the run page.
        page.goto(f"{base}/runs/{run.pk}/#seq-{run.last_seq}")
        page.wait_for_timeout(500)
        assert page.url.endswith(f"/runs/{run.pk}/#seq-{run.last_seq}")
