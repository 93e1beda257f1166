"""Dark mode in a real browser: a system set to dark gets dark pages (syntax highlighting too),
and the header's theme button overrides the system, sticks across reloads and is applied before
the first paint."""

from __future__ import annotations

import re

from agents import approvals
from agents.models import Run, RunStatus
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.scenes import waiting_demo
from tests.procs import wait_for

pytestmark = BROWSER_TEST


def luminance(css: str) -> float:
    """WCAG relative luminance of a computed colour ("rgb(r, g, b)" or "rgba(...)")."""
    r, g, b = (int(v) / 255 for v in re.findall(r"[\d.]+", css)[:3])

    def lin(c):
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)


def colours(page, selector: str) -> dict[str, float]:
    found = page.evaluate(
        """(sel) => { const el = document.querySelector(sel); if (!el) return null;
          const s = getComputedStyle(el); return {bg: s.backgroundColor, fg: s.color}; }""",
        selector,
    )
    assert found, f"{selector} is not on {page.url}"
    return {k: luminance(v) for k, v in found.items()}


def assert_dark(page, *selectors: str) -> None:
    for sel in ("body", *selectors):
        c = colours(page, sel)
        print(page.url, sel, c)
        assert c["bg"] < 0.05 and c["fg"] > 0.4, (sel, c)


def assert_light(page) -> None:
    c = colours(page, "body")
    assert c["bg"] > 0.8 and c["fg"] < 0.05, c


def test_a_dark_system_gets_dark_pages_and_dark_highlighting(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = waiting_demo(eve)
        page = pages(color_scheme="dark")
        log_in(page, base)
        page.goto(f"{base}/")  # the runs list (a person lands on the Overview)
        assert_dark(page, "table.runs", "#run-rows .goal a")
        page.screenshot(path=str(shots / "dark-runs-list.png"))
        page.goto(f"{base}/approvals/")
        assert_dark(page, ".approval.a-pending", ".approval.a-pending input[name=reason]")
        page.screenshot(path=str(shots / "dark-approvals.png"))
        page.goto(f"{base}/runs/{run.pk}/")
        wait_js(page, "document.querySelector('#live-state.on') !== null")
        assert_dark(page, "#run-header", "#stream", ".ev .ev-body")
        page.screenshot(path=str(shots / "dark-run.png"))
        # Approved, the demo finishes and saves textstats.py: its highlighted view is dark too.
        pending = run.approvals.get(status="pending")
        approvals.decide(pending.pk, user=eve, approve=True)
        wait_for(
            lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED,
            timeout=120,
            what=f"run {run.pk} to succeed",
            interval=0.2,
        )
        artifact = run.artifacts.get(name="textstats.py")
        page.goto(f"{base}/runs/{run.pk}/artifacts/{artifact.pk}/")
        page.wait_for_selector(".viewer .hl")
        assert_dark(page, ".viewer .hl")
        keyword = colours(page, ".viewer .hl .k, .viewer .hl .kn")
        print("keyword", keyword)
        assert keyword["fg"] > 0.2  # readable on the dark box (the light style's is 0.1)


def test_the_theme_button_overrides_the_system_and_sticks(pages, eve, tmp_path):
    with serving(tmp_path) as base:
        page = pages(color_scheme="light")
        # What <html> says when <body> first appears: a theme set then is there for the first paint.
        page.context.add_init_script(
            """new MutationObserver((_, obs) => { if (document.body) {
                 window.__themeAtBody = document.documentElement.getAttribute('data-theme');
                 obs.disconnect(); } }).observe(document, {childList: true, subtree: true});"""
        )
        log_in(page, base)
        page.goto(f"{base}/")  # the runs list (a person lands on the Overview)
        assert_light(page)
        toggle = page.locator("#theme-toggle")
        assert toggle.inner_text() == "Theme: system"
        toggle.click()
        assert toggle.inner_text() == "Theme: dark"
        assert_dark(page, "table.runs")
        page.reload()
        assert page.evaluate("window.__themeAtBody") == "dark"
        assert_dark(page, "table.runs")
        page.goto(f"{base}/approvals/")
        assert_dark(page)
        page.locator("#theme-toggle").click()  # light, whatever the system says
        assert page.locator("#theme-toggle").inner_text() == "Theme: light"
        assert_light(page)
        page.locator("#theme-toggle").click()  # back to the system's
        assert page.locator("#theme-toggle").inner_text() == "Theme: system"
        page.reload()
        assert page.evaluate("window.__themeAtBody") is None
        assert_light(page)
        # On a dark system, "system" is dark and one press gives light.
        dark = pages(color_scheme="dark")
        log_in(dark, base)
        assert_dark(dark)
        dark.locator("#theme-toggle").click()
        assert_light(dark)
