"""The product on a bucket (moto's S3 server) in a real browser: the demo's workspace lives in the
bucket, the diff page reads it there after the host's workspace folder is gone, and approving the
waiting step brings the workspace back from the bucket (a `workspace.restored` event on the run
page) before the run goes on to succeed."""

from __future__ import annotations

import os
import shutil

import pytest

from agents.models import Event, Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, start_demo, wait_js
from tests.procs import dump_events, wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def test_the_demo_on_a_bucket_survives_losing_its_workspace_folder(
    pages, eve, tmp_path, s3_url, moto_server
):
    workspaces = tmp_path / "host-workspaces"
    env = {
        "SHIFTLOG_DEMO_TURN_DELAY": "0",
        "SHIFTLOG_BLOB_STORE": s3_url,
        "SHIFTLOG_WORKSPACES": str(workspaces),
        "SHIFTLOG_HOST": "web-and-worker",
        **moto_server.env(),
    }
    with serving(tmp_path, **env) as base:
        page = pages()
        log_in(page, base)
        run_id = start_demo(page, base)
        wait_js(
            page,
            "document.querySelector('#run-header .status').textContent.trim().toLowerCase()"
            " === 'awaiting approval'",
            timeout=90_000,
        )
        run = Run.objects.get(pk=run_id)
        assert run.workspace_tree  # every changing call went to the bucket
        start = run.checkpoints.get(kind="run_start")
        shutil.rmtree(workspaces / f"run-{run_id}")  # this host's copy is gone
        page.goto(f"{base}/runs/{run_id}/diff/?a={start.number}&b=live")
        body = page.inner_text("main")
        assert "textstats.py" in body and "def word_count" in body
        page.goto(f"{base}/runs/{run_id}/")
        page.click(".approval.a-pending button[value=approve]", timeout=30_000)
        wait_for(
            lambda: Event.objects.filter(run_id=run_id, kind="workspace.restored").exists(),
            timeout=60,
            what="the worker to restore the workspace from the bucket",
            details=lambda: dump_events(run_id),
        )
        page.wait_for_selector(".ev.workspace-restored", timeout=30_000)
        assert "workspace restored on web-and-worker" in page.inner_text(".ev.workspace-restored")
        wait_for(
            lambda: Run.objects.get(pk=run_id).status == "succeeded",
            timeout=120,
            what="the demo to succeed after its workspace came back from the bucket",
        )
        restored = Event.objects.get(run_id=run_id, kind="workspace.restored").payload
        assert restored["had"] == "nothing" and restored["files"] >= 2
        assert (workspaces / f"run-{run_id}" / "textstats.py").exists()
