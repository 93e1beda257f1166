"""The approvals inbox from the keyboard, in a real browser with two real waiting approvals:
j/k move, a approves, d denies with a reason, e opens the edit box, ? shows the keys; keys typed
into a field stay in the field."""

from __future__ import annotations

from agents.models import Approval
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.scenes import waiting_demo
from tests.procs import wait_for

pytestmark = BROWSER_TEST

CURRENT = "document.querySelector('.approval[aria-current=true]')?.id"


def test_the_inbox_from_the_keyboard(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        first, second = waiting_demo(eve), waiting_demo(eve)
        ids = [f"approval-{run.approvals.get(status='pending').pk}" for run in (first, second)]
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/approvals/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        order = page.eval_on_selector_all("#approval-list .approval", "els => els.map(e => e.id)")
        assert sorted(order) == sorted(ids), order

        # ? lists the keys; Esc closes the list.
        page.keyboard.press("?")
        help_box = page.locator("dialog.keys-help")
        assert help_box.is_visible()
        for key in ("j", "k", "a", "d", "e", "?"):
            assert help_box.locator(f"kbd:text-is('{key}')").count() == 1, key
        page.screenshot(path=str(shots / "keyboard-help.png"))
        page.keyboard.press("Escape")
        assert not help_box.is_visible()

        # j and k move between the cards, with a ring and aria-current on the one they act on.
        page.keyboard.press("j")
        assert page.evaluate(CURRENT) == order[0]
        assert page.evaluate("document.activeElement.id") == order[0]
        ring = page.evaluate(
            f"getComputedStyle(document.getElementById('{order[0]}')).outlineStyle"
        )
        assert ring == "solid"
        page.keyboard.press("j")
        assert page.evaluate(CURRENT) == order[1]
        page.keyboard.press("j")  # the last stays the last
        assert page.evaluate(CURRENT) == order[1]
        page.keyboard.press("k")
        assert page.evaluate(CURRENT) == order[0]

        # e opens the edit box with the cursor in it; keys typed there stay there.
        page.keyboard.press("e")
        assert page.evaluate(
            f"document.querySelector('#{order[0]} details.edit').open"
            f" && document.activeElement === document.querySelector('#{order[0]} textarea')"
        )
        page.keyboard.type(" jkad")
        assert " jkad" in page.input_value(f"#{order[0]} textarea")
        assert page.evaluate(CURRENT) == order[0]
        page.keyboard.press("Escape")  # back to the card
        assert page.evaluate("document.activeElement.id") == order[0]

        # d on the second card: the reason box has the cursor; Enter denies (not approves).
        page.keyboard.press("j")
        page.keyboard.press("d")
        assert page.evaluate(
            f"document.activeElement === document.querySelector('#{order[1]} input[name=reason]')"
        )
        page.keyboard.type("not today: keep the build folder")
        page.keyboard.press("Enter")
        page.wait_for_selector(f"#{order[1]}.a-denied")
        denied = Approval.objects.get(pk=int(order[1].split("-")[1]))
        assert denied.status == "denied" and denied.comment == "not today: keep the build folder"
        assert denied.decided_by == eve
        wait_js(page, f"{CURRENT} === '{order[1]}'")  # still on the card, now decided

        # a on the first card approves it, through its form.
        page.keyboard.press("k")
        page.keyboard.press("a")
        page.wait_for_selector(f"#{order[0]}.a-approved")
        approved = Approval.objects.get(pk=int(order[0].split("-")[1]))
        assert approved.status == "approved" and approved.decided_by == eve
        wait_for(
            lambda: not Approval.objects.filter(status="pending").exists(),
            timeout=10,
            what="no approval to wait",
        )
        wait_js(page, "document.querySelector('#approval-count').textContent.trim() === '0'")
