"""The API from a browser: the docs page (Swagger UI from our own static files) lists every
operation under the pages' Content-Security-Policy, and "Try it out" with a token reaches the
API and shows the answer."""

from __future__ import annotations

from agents import services
from agents.runspec import RunSpec
from tests.e2e.helpers import BROWSER_TEST, log_in, serving, wait_js
from tests.procs import Procs

pytestmark = BROWSER_TEST


def test_the_docs_page_lists_every_operation_and_tries_one_with_a_token(
    pages, eve, tmp_path, shots
):
    run = services.create_run(
        RunSpec(goal="an external run", checks=["true"], provider="external"), created_by=eve
    )
    token = Procs(tmp_path).manage("create_token", "--user", "eve", "--scopes", "read").split()[-1]
    with serving(tmp_path) as base:
        page = pages()
        refused = []
        page.on(
            "console",
            lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
        )
        # Not logged in: to the login page, never the docs.
        page.goto(f"{base}/api/v1/docs")
        assert "/accounts/login/" in page.url
        log_in(page, base)
        page.goto(f"{base}/api/v1/docs")
        wait_js(page, "document.querySelectorAll('.opblock').length > 0", timeout=30_000)
        operations = page.locator(".opblock").count()
        assert operations >= 31, operations
        assert (
            page.locator(
                ".opblock-summary-path", has_text="/api/v1/runs/{run_id}/tool-calls"
            ).count()
            >= 1
        )

        # Authorize with the token, then try GET /api/v1/runs/{run_id}.
        page.click("button.authorize")
        page.fill(".auth-container input[type=text], .auth-container input[type=password]", token)
        page.click(".auth-btn-wrapper button.authorize")
        page.click(".btn-done")
        block = page.locator(
            ".opblock-get",
            has=page.locator(".opblock-summary-path[data-path='/api/v1/runs/{run_id}']"),
        )
        block.locator(".opblock-summary").click()
        block.locator("button.try-out__btn").click()
        block.locator("input[placeholder='run_id']").fill(str(run.pk))
        block.locator("button.execute").click()
        wait_js(
            page,
            "document.querySelector('.live-responses-table tbody .response-col_status') !== null",
            timeout=30_000,
        )
        status = (
            block.locator(".live-responses-table tbody .response-col_status")
            .first.inner_text()
            .strip()
        )
        assert status == "200", status
        assert (
            '"external": true'
            in block.locator(".live-responses-table .microlight").first.inner_text()
        )
        page.screenshot(path=str(shots / "api-docs.png"), full_page=False)
    assert refused == [], refused
