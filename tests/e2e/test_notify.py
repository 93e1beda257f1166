"""Approvals seen from another tab: the title carries the waiting count, and with "Notify me" on a
rise of the count pushed over the socket shows a browser notification (recorded by a stand-in
for window.Notification: a headless browser shows none)."""

from __future__ import annotations

from agents import services
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js

pytestmark = BROWSER_TEST

# Runs before the page's own scripts: a Notification that records instead of showing.
STUB = """
window.__notes = [];
window.__asked = 0;
class StubNotification {
  constructor(title, options) { window.__notes.push({title, body: (options || {}).body, tag: (options || {}).tag}); }
  static get permission() { return 'granted'; }  // as the context granted it
  static requestPermission() { window.__asked += 1; return Promise.resolve('granted'); }
}
window.Notification = StubNotification;
"""


def test_the_title_counts_waiting_approvals_and_notify_me_notifies(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        page = pages()
        page.context.grant_permissions(["notifications"], origin=base)
        page.context.add_init_script(STUB)
        log_in(page, base)
        page.goto(f"{base}/")  # the runs list (a person lands on the Overview)
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        assert page.title() == "Runs · Shiftlog"
        button = page.locator("#notify-toggle")
        assert button.is_visible() and button.get_attribute("aria-pressed") == "false"

        # Before opting in: the title counts, no notification.
        services.create_demo_run(created_by=eve)
        wait_js(page, "document.title === '(1) Runs · Shiftlog'", timeout=90_000)
        assert page.evaluate("window.__notes") == []

        # Opted in: the browser is asked once, and the next approval shows a notification.
        button.click()
        wait_js(
            page, "document.querySelector('#notify-toggle').getAttribute('aria-pressed') === 'true'"
        )
        assert page.evaluate("window.__asked") == 1
        assert button.inner_text() == "Notifying"
        services.create_demo_run(created_by=eve)
        wait_js(page, "document.title === '(2) Runs · Shiftlog'", timeout=90_000)
        notes = page.evaluate("window.__notes")
        print("notifications", notes)
        assert len(notes) == 1
        assert notes[0]["title"] == "Shiftlog: an approval waits"
        assert notes[0]["body"] == "2 tool calls wait for a person."

        # A page loaded with approvals already waiting counts them at once, and stays opted in.
        page.goto(f"{base}/approvals/")
        assert page.title() == "(2) Approvals · Shiftlog"
        assert page.locator("#notify-toggle").get_attribute("aria-pressed") == "true"
        assert page.evaluate("window.__notes") == []  # nothing new: no notification on load

        # Deciding one lowers the count: the title follows, nothing is shown.
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        page.fill(".approval.a-pending input[name=reason]", "not now")
        page.locator(".approval.a-pending button[value=deny]").first.click()
        wait_js(page, "document.title === '(1) Approvals · Shiftlog'")
        assert page.evaluate("window.__notes") == []

        # Turned off: the next rise shows nothing.
        page.locator("#notify-toggle").click()
        assert page.locator("#notify-toggle").get_attribute("aria-pressed") == "false"
        services.create_demo_run(created_by=eve)
        wait_js(page, "document.title === '(2) Approvals · Shiftlog'", timeout=90_000)
        assert page.evaluate("window.__notes") == []
