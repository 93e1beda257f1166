"""axe-core (tests/e2e/vendor/axe.min.js, 4.14) finds no serious or critical violation on the
pages of a run, in light and in dark; a skip link comes first; the event stream and the approvals
badge are polite live regions."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.scenes import page_urls, waiting_demo

pytestmark = BROWSER_TEST

AXE = (Path(__file__).parent / "vendor" / "axe.min.js").read_text()

# The Content-Security-Policy refuses an added <script>; evaluating through the debugging
# protocol is not a page script, so it runs.
RUN_AXE = """async () => {
  const result = await axe.run(document, {resultTypes: ['violations']});
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => ({id: v.id, impact: v.impact, help: v.help,
                  nodes: v.nodes.slice(0, 4).map((n) => n.target.join(' ') + ' ' + n.failureSummary)}));
}"""


def violations(page) -> list[dict]:
    if not page.evaluate("typeof axe !== 'undefined'"):
        page.evaluate(AXE + "; true;")
    found = page.evaluate(RUN_AXE)
    print(page.url, len(found), "serious or critical:", found)
    return found


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_axe_finds_nothing_serious_on_the_pages_of_a_run(pages, eve, tmp_path, scheme):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = waiting_demo(eve)
        urls = {**page_urls(run), "overview": "/overview/"}
        anonymous = pages(color_scheme=scheme)
        anonymous.goto(f"{base}/accounts/login/")
        found = {"login": violations(anonymous)}
        page = pages(color_scheme=scheme)
        log_in(page, base)
        for name, path in urls.items():
            response = page.goto(base + path)
            if response.status == 404 and name == "overview":
                print("no /overview/ on this branch")
                continue
            assert response.ok, (name, response.status)
            if name in ("run page", "approvals"):
                page.wait_for_selector(".approval.a-pending form.decide")
            found[name] = violations(page)
        assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_a_skip_link_comes_first_and_the_stream_and_badge_are_live_regions(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = waiting_demo(eve)
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{run.pk}/")
        page.keyboard.press("Tab")
        first = page.evaluate("[document.activeElement.textContent.trim(), location.hash]")
        assert first[0] == "Skip to content", first
        assert page.locator(".skip-link").bounding_box()["y"] >= 0  # shown when focused
        page.keyboard.press("Enter")
        wait_js(page, "document.activeElement === document.querySelector('main')")
        assert page.get_attribute("#stream", "aria-live") == "polite"
        live_badge = page.evaluate(
            "document.querySelector('#approval-count').closest('[aria-live]')?.getAttribute('aria-live')"
        )
        assert live_badge == "polite"
        # The live region outlives the badge's swaps (a replaced live region announces nothing).
        page.goto(f"{base}/approvals/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        page.evaluate(
            "window.__region = document.querySelector('#approval-count').closest('[aria-live]')"
        )
        page.click(".approval.a-pending button[value=approve]")
        wait_js(page, "document.querySelector('#approval-count').textContent.trim() === '0'")
        assert page.evaluate(
            "document.querySelector('#approval-count').closest('[aria-live]') === window.__region"
        )
