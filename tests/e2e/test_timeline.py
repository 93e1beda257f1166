"""The run timeline in a real browser against a real `serve`: the demo run's timeline leads to
its events, zooms by drag and by keys, and breaks no rule of the Content-Security-Policy; a
100,000-event run's timeline and run page open fast (the figures are printed, never asserted).

Set SHIFTLOG_SCREENSHOTS=DIR to keep the screenshot (the README's comes from here)."""

from __future__ import annotations

import os
import re
import time

from agents import services
from agents.models import Run
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.e2e.test_security import REPORT_VIOLATIONS
from tests.helpers import approve_pending
from tests.test_timeline import hand_made
from tests.timeline_runs import big_run

pytestmark = BROWSER_TEST


def watch_violations(page) -> list[str]:
    violations: list[str] = []
    page.add_init_script(REPORT_VIOLATIONS)
    page.on("console", lambda m: violations.append(m.text) if "CSP-VIOLATION" in m.text else None)
    return violations


def drawn(page, times: int = 1) -> None:
    wait_js(page, f"Number(document.getElementById('timeline').dataset.drawn || 0) >= {times}")


def draws(page) -> int:
    return int(page.evaluate("document.getElementById('timeline').dataset.drawn || 0"))


def centre_of(page, what: str) -> dict:
    """Page coordinates of the middle of the first drawn bar matching `what` (JS on a hit)."""
    box = page.evaluate(
        f"""() => {{
        const v = window.__timelineView, r = v.canvas.getBoundingClientRect();
        const h = v.hits.find(h => {what});
        return h && {{x: r.left + h.x + Math.min(h.w, 6) / 2, y: r.top + h.y + h.h / 2}};
    }}"""
    )
    assert box, f"nothing drawn matches {what}"
    return box


def test_the_demo_runs_timeline_leads_to_its_events_and_zooms(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.3") as base:
        run = services.create_demo_run(created_by=eve)
        page = pages()
        violations = watch_violations(page)
        log_in(page, base)
        deadline = time.monotonic() + 120
        while Run.objects.get(pk=run.pk).status != "awaiting_approval":
            assert time.monotonic() < deadline, Run.objects.get(pk=run.pk).status_reason
            time.sleep(0.3)
        time.sleep(2)  # a visible wait for a person
        approve_pending(run, eve)
        while Run.objects.get(pk=run.pk).status != "succeeded":
            assert time.monotonic() < deadline, Run.objects.get(pk=run.pk).status_reason
            time.sleep(0.3)

        page.goto(f"{base}/runs/{run.pk}/")
        page.click("#run-header a.timeline-link")
        page.wait_for_url(f"{base}/runs/{run.pk}/timeline/")
        drawn(page)
        label = page.get_attribute("#tl-canvas", "aria-label")
        assert label.startswith(f"Timeline of Run {run.pk}, events #1 to #"), label
        assert "shown one by one" in label
        page.screenshot(path=str(shots / "timeline.png"), full_page=True)
        modes = page.evaluate("window.__timeline.loads.map(l => l.mode)")
        assert modes == ["detail"]
        assert page.locator("#chart-usage canvas").count() == 1
        assert page.locator("#tl-table a").count() > 10

        # A click on a tool call's bar opens the run page at that event.
        box = centre_of(page, "h.item && h.item.kind === 'tool'")
        page.mouse.click(box["x"], box["y"])
        page.wait_for_url(re.compile(rf".*/runs/{run.pk}/events/\d+/$"))
        seq = int(page.url.rstrip("/").rsplit("/", 1)[1])
        assert run.events.get(seq=seq).kind == "tool.call"
        pk = run.events.get(seq=seq).pk
        wait_js(page, f"document.activeElement && document.activeElement.id === 'event-{pk}'")
        assert page.get_attribute(f"#event-{pk}", "aria-current") == "true"
        assert "ev-target" in page.get_attribute(f"#event-{pk}", "class")
        assert "not live" in page.inner_text(".event-banner")
        assert page.locator("#run-header").count() == 1 and page.locator("#meters").count() == 1

        # Drag across a stretch: the window narrows and is kept in the URL.
        page.go_back()
        drawn(page)
        before = draws(page)
        frame = page.locator("#tl-canvas").bounding_box()
        y = frame["y"] + 40
        page.mouse.move(frame["x"] + 200, y)
        page.mouse.down()
        page.mouse.move(frame["x"] + 420, y, steps=8)
        page.mouse.move(frame["x"] + 500, y, steps=4)
        page.mouse.up()
        drawn(page, before + 1)
        match = re.search(r"\?from=(\d+)&to=(\d+)$", page.url)
        assert match, page.url
        first, last = map(int, match.groups())
        w = page.evaluate("window.__timelineView.data.window")
        assert (w["from"], w["to"]) == (first, last) and last > first
        # Keys: zoom out, zoom in, a step (towards whichever side has room; a key with nothing to
        # do, like zooming into fewer than 4 events, draws nothing), back to the whole run.
        page.locator("#tl-canvas").focus()
        for key in ("-", "+", "step"):
            if key == "step":
                w = page.evaluate("window.__timelineView.data.window")
                key = "ArrowLeft" if w["from"] > 1 else "ArrowRight"
            n = draws(page)
            page.keyboard.press(key)
            drawn(page, n + 1)
            assert "from=" in page.url
        n = draws(page)
        page.keyboard.press("0")
        drawn(page, n + 1)
        assert page.url.endswith("/timeline/")
    assert violations == []


def test_a_100k_event_run_opens_fast(pages, eve, tmp_path, shots):
    from django.utils import timezone

    t0 = time.perf_counter()
    run = Run.objects.create(
        goal="A long run: a hundred thousand events",
        model="claude-test",
        created_by=eve,
        status="running",
        started_at=timezone.now(),
        max_tokens=200_000_000,
        max_sessions=2000,
    )
    big_run(run, 100_000)
    print(f"\n100,000-event run written in {time.perf_counter() - t0:.1f} s")
    small = hand_made(eve)
    print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    with serving(tmp_path) as base:
        page = pages()
        violations = watch_violations(page)
        log_in(page, base)

        # The run page, as the issue asks: under 200 ms of server time at 100k events; beside
        # it a run of 28 events, so what the size of the log costs shows apart from the machine.
        for label, pk in (("100k events", run.pk), ("28 events", small.pk)):
            page_ms = []
            for _ in range(5):
                page.goto(f"{base}/runs/{pk}/")
                page_ms.append(
                    page.evaluate(
                        "(() => { const n = performance.getEntriesByType('navigation')[0];"
                        " return n.responseStart - n.requestStart; })()"
                    )
                )
            print(
                f"run page at {label}, server time (request to first byte): first "
                f"{page_ms[0]:.0f} ms, then {', '.join(f'{m:.0f}' for m in page_ms[1:])} ms"
            )

        page.goto(f"{base}/runs/{run.pk}/timeline/")
        drawn(page)
        first = page.evaluate("window.__timeline.loads[0]")
        n = draws(page)
        page.reload()
        drawn(page)
        second = page.evaluate("window.__timeline.loads[0]")
        assert first["mode"] == "buckets"
        print(
            f"timeline.json at 100k events, server time: first {first['server_ms']:.0f} ms "
            f"(builds the index), later {second['server_ms']:.1f} ms"
        )
        print(
            f"timeline drawn in the browser (fetch + draw): first {first['total_ms']:.0f} ms "
            f"(draw {first['draw_ms']:.0f} ms), later {second['total_ms']:.0f} ms "
            f"(draw {second['draw_ms']:.0f} ms)"
        )
        # Zoom in by keys until each item is drawn; the tab stays responsive throughout.
        zooms = 0
        while page.evaluate("window.__timelineView.data.window.mode") == "buckets":
            n = draws(page)
            page.keyboard.press("+")
            drawn(page, n + 1)
            zooms += 1
            assert zooms < 20
        last = page.evaluate("window.__timeline.loads[window.__timeline.loads.length - 1]")
        print(
            f"zoomed in {zooms} times to single items: server {last['server_ms']:.1f} ms, "
            f"drawn in {last['total_ms']:.0f} ms"
        )
        t = time.perf_counter()
        assert page.evaluate("1 + 1") == 2  # the tab answers
        print(f"the tab answered a script in {(time.perf_counter() - t) * 1000:.0f} ms")
        page.screenshot(path=str(shots / "timeline-100k.png"), full_page=True)
    assert violations == []
