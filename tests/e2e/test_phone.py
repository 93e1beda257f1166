"""At a phone's size (390 by 844, touch): no page of a run scrolls sideways, the header's links and
"Log out" stay on screen, the runs table becomes one card per run, the run page is one column,
and an approval card's buttons are full-width, at least 44 px tall and on screen."""

from __future__ import annotations

from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.scenes import PHONE, page_urls, waiting_demo

pytestmark = BROWSER_TEST

WIDTH = PHONE["viewport"]["width"]
SHOTS = {"runs list": "runs-list", "run page": "run", "approvals": "approvals"}

# Everything on the page wider than the screen, or a control of the header/card off it.
MEASURE = """() => {
  const width = document.documentElement.clientWidth;
  const off = (sel) => [...document.querySelectorAll(sel)].filter((el) => {
    const r = el.getBoundingClientRect();
    return r.width > 0 && (r.left < 0 || r.right > width + 0.5);
  }).map((el) => `${sel}: ${el.outerHTML.slice(0, 80)}`);
  const wide = [...document.body.querySelectorAll('*')].filter((el) => {
    const r = el.getBoundingClientRect();
    return r.right > width + 0.5 && !el.closest('pre, .hl, table.hltable');
  }).map((el) => `${el.tagName.toLowerCase()}.${el.className}`.slice(0, 60));
  return {
    scrollWidth: document.documentElement.scrollWidth,
    innerWidth: window.innerWidth,
    clientWidth: width,
    offscreen: [...off('.topbar a, .topbar button'), ...off('.approval.a-pending a, .approval.a-pending button')],
    wide: wide.slice(0, 8),
  };
}"""

BUTTONS = """() => [...document.querySelectorAll('.approval.a-pending form.decide button')]
  .filter((b) => b.getBoundingClientRect().width > 0)
  .map((b) => {
    const r = b.getBoundingClientRect(), f = b.closest('form').getBoundingClientRect();
    return {text: b.textContent.trim(), height: r.height, width: r.width, form: f.width};
  })"""


def test_every_page_of_a_run_fits_a_phone(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = waiting_demo(eve)
        urls = page_urls(run)
        page = pages(**PHONE)
        log_in(page, base)
        problems = {}
        for name, path in urls.items():
            page.goto(base + path)
            page.wait_for_selector("main")
            m = page.evaluate(MEASURE)
            print(name, m)
            if name in SHOTS:
                page.screenshot(path=str(shots / f"phone-{SHOTS[name]}.png"))
            if m["scrollWidth"] > WIDTH or m["offscreen"]:
                problems[name] = m
            if name in ("run page", "approvals"):
                page.wait_for_selector(".approval.a-pending form.decide")
                page.click(".approval.a-pending details.edit summary")
                buttons = page.evaluate(BUTTONS)
                print(name, "buttons", buttons)
                small = [b for b in buttons if b["height"] < 44 or b["width"] < b["form"] - 1]
                if small:
                    problems[f"{name} buttons"] = small
                if page.evaluate(MEASURE)["offscreen"]:
                    problems[f"{name}, edit box open"] = page.evaluate(MEASURE)
        assert not problems, problems


def test_the_runs_list_is_one_card_per_run_and_the_run_page_one_column(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = waiting_demo(eve)
        page = pages(**PHONE)
        log_in(page, base)
        page.goto(f"{base}/")
        row = page.locator(f"#run-{run.pk}")
        box = row.bounding_box()
        print("run card", box)
        assert box["width"] <= WIDTH
        # Each field shows its column's name beside it; the table's header row is not shown.
        labels = page.evaluate(
            f"[...document.querySelectorAll('#run-{run.pk} td')].map("
            "(td) => getComputedStyle(td, '::before').content)"
        )
        print("labels", labels)
        for label in ("Cost", "Last activity", "Approvals"):
            assert f'"{label}"' in labels, labels
        head = page.locator("table.runs thead").bounding_box()
        assert head["height"] <= 1 and head["width"] <= 1, head  # kept for screen readers only
        # The log-out button is on screen and can be pressed.
        logout = page.locator(".topbar button:has-text('Log out')").bounding_box()
        assert logout["x"] >= 0 and logout["x"] + logout["width"] <= WIDTH, logout
        page.goto(f"{base}/runs/{run.pk}/")
        wait_js(page, "document.querySelector('#stream') !== null")
        stream = page.locator(".stream-col").bounding_box()
        side = page.locator(".side-col").bounding_box()
        print("stream", stream, "side", side)
        assert side["y"] >= stream["y"] + stream["height"] - 1  # below it, not beside it
