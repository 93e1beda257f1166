"""Export in a real browser against a real `serve`: a checkpoint's "download .tar.gz" and the
diff page's "Download patch" give files that tar and `git apply` accept."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

import pytest

from agents import export
from agents.models import Run
from tests.e2e.helpers import CHROMIUM, log_in, serving, start_demo, wait_js
from tests.test_export import GIT_ENV, files_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.ui_only,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not os.path.exists(CHROMIUM), reason="chromium is not installed (make system-deps)"
    ),
]


def download(page, selector: str, tmp_path, name: str) -> tuple[str, bytes]:
    with page.expect_download() as info:
        page.click(selector)
    target = tmp_path / name
    info.value.save_as(target)
    return info.value.suggested_filename, target.read_bytes()


def extract(data: bytes, folder) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        names = tar.getnames()
        tar.extractall(folder, filter="fully_trusted")
    return names


def test_download_a_checkpoint_and_a_patch_that_git_applies(pages, eve, tmp_path):
    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0") as base:
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
        start = run.checkpoints.get(kind="run_start")
        end = run.checkpoints.get(kind="session_end")
        page.goto(f"{base}/runs/{run_id}/")
        tars = {}
        for cp in (start, end):
            name, data = download(
                page,
                f"#checkpoint-{cp.number} a:has-text('download .tar.gz')",
                tmp_path,
                f"{cp.pk}.tar.gz",
            )
            top = name.removesuffix(".tar.gz")
            assert name == f"{export.tar_name(cp)}.tar.gz"
            tars[cp.pk] = (top, extract(data, tmp_path / f"cp-{cp.pk}"))
        top, names = tars[end.pk]
        assert names[0] == top
        assert {f"{top}/textstats.py", f"{top}/test_textstats.py"} <= set(names)
        page.goto(f"{base}/runs/{run_id}/diff/?a={start.number}&b={end.number}")
        name, data = download(page, "a:has-text('Download patch')", tmp_path, "change.patch")
        assert name.endswith(".patch") and b"+++ b/textstats.py" in data
        # The patch turns the first checkpoint's files into the second's.
        repo = tmp_path / f"cp-{start.pk}" / tars[start.pk][0]
        subprocess.run(["git", "init", "-q"], cwd=repo, env=GIT_ENV, check=True)
        subprocess.run(
            ["git", "apply", str(tmp_path / "change.patch")], cwd=repo, env=GIT_ENV, check=True
        )
        assert files_of(repo) == files_of(tmp_path / f"cp-{end.pk}" / top)
