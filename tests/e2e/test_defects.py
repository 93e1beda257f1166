"""The smaller defects a new user met, each seen in a real browser against a real `serve`: the
artifact viewer's line numbers, the harness's Markdown, one checkpoint number everywhere, the
checkpoint's size wording, and the favicon."""

from __future__ import annotations

import os
import urllib.request

import pytest

from agents import approvals, services
from agents.models import Run, RunStatus
from tests.e2e.helpers import CHROMIUM, log_in, serving, status_of, wait_js
from tests.procs import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]

# The line-number column and the code column must keep to the same lines: same height, and no
# number wrapped ("1" over "0" for 10).
ALIGNED = """(() => {
  const nums = document.querySelector('.hltable td.linenos pre');
  const code = document.querySelector('.hltable td.code pre');
  const cell = document.querySelector('.hltable td.linenos');
  const lines = code.textContent.replace(/\\n$/, '').split('\\n').length;
  const style = getComputedStyle(code);
  const lineHeight = parseFloat(style.lineHeight);
  const inner = code.getBoundingClientRect().height - parseFloat(style.paddingTop)
    - parseFloat(style.paddingBottom);
  return {
    nums: nums.getBoundingClientRect().height,
    code: code.getBoundingClientRect().height,
    lines: lines,
    codeLines: Math.round(inner / lineHeight),
    numsFit: nums.scrollWidth <= cell.clientWidth,
    boxFits: document.querySelector('.hl').getBoundingClientRect().right <= window.innerWidth,
  };
})()"""


def finished_demo(eve) -> Run:
    run = services.create_demo_run(created_by=eve)
    wait_for(
        lambda: run.approvals.filter(status="pending").exists(), timeout=90, what="the approval"
    )
    approvals.decide(run.approvals.get(status="pending").pk, user=eve, approve=True)
    wait_for(
        lambda: status_of(run.pk) == RunStatus.SUCCEEDED, timeout=90, what="the run to succeed"
    )
    return Run.objects.get(pk=run.pk)


def test_viewers_numbers_and_wording_in_a_finished_demo(pages, eve, tmp_path, shots):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
        run = finished_demo(eve)
        page = pages()
        log_in(page, base)

        # 7. The artifact viewer: numbers beside their lines, at a desk's width and a phone's.
        module = run.artifacts.get(name="textstats.py")
        for width in (1360, 390):
            page.set_viewport_size({"width": width, "height": 844})
            page.goto(f"{base}/runs/{run.pk}/artifacts/{module.pk}/")
            got = page.evaluate(ALIGNED)
            assert got["lines"] >= 10, got
            assert abs(got["nums"] - got["code"]) < 1, got  # same height: no line wrapped
            assert got["codeLines"] == got["lines"], got
            assert got["numsFit"] and got["boxFits"], got
        page.screenshot(path=str(shots / "artifact-phone.png"))
        page.set_viewport_size({"width": 1360, "height": 900})

        # 8. The harness's Markdown: a handoff's lists are lists; failed output is verbatim.
        handoff = run.artifacts.get(kind="handoff")
        page.goto(f"{base}/runs/{run.pk}/artifacts/{handoff.pk}/")
        assert page.locator(".markdown h2:has-text('Next steps') + ul li").count() >= 1
        failed = next(
            a
            for a in run.artifacts.filter(kind="report").order_by("seq")
            if "FAILED" in a.name or "FAILED" in _text(base, page, run, a)
        )
        page.goto(f"{base}/runs/{run.pk}/artifacts/{failed.pk}/")
        assert page.locator(".markdown pre").count() >= 1
        assert page.locator(".markdown hr").count() == 0

        # 10. One number per checkpoint, 1, 2, 3 ... in the panel, the links and the diff page.
        numbers = list(run.checkpoints.order_by("seq").values_list("number", flat=True))
        assert numbers == list(range(1, len(numbers) + 1))
        page.goto(f"{base}/runs/{run.pk}/")
        panel = page.inner_text("#checkpoints")
        for n in numbers:
            assert f"Checkpoint {n}" in panel
        # 12. Its size says what grew, not "+0 bytes" (which reads as "nothing changed").
        assert "store grew by" in panel and "+0" not in panel
        page.click("#checkpoint-2 a:has-text('diff with previous')")
        page.wait_for_selector("#diff-summary")
        assert page.inner_text("h1") == "Checkpoint 1 → checkpoint 2"
        assert page.url.endswith("?a=1&b=2")
        page.goto(f"{base}/runs/{run.pk}/checkpoints/{numbers[-1]}/fork")
        assert f"Fork run {run.pk} from checkpoint {numbers[-1]}" in page.inner_text("h2")

        # 12. A favicon, on our pages and at the address browsers try by themselves.
        icon = page.evaluate("document.querySelector('link[rel=icon]').href")
        with urllib.request.urlopen(icon) as r:
            assert r.status == 200 and b"<svg" in r.read()
        with urllib.request.urlopen(f"{base}/favicon.ico") as r:
            assert r.status == 200 and r.url.endswith("favicon.svg")


def _text(base, page, run, artifact) -> str:
    page.goto(f"{base}/runs/{run.pk}/artifacts/{artifact.pk}/")
    wait_js(page, "document.querySelector('.viewer') !== null")
    return page.inner_text(".viewer")
