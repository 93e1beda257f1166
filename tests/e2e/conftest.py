"""Fixtures of the browser tests: Debian's Chromium through the playwright package (never a
Playwright browser download), pages that keep a screenshot of their last state, and eve, who may
watch, control and decide."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from tests.e2e.helpers import ARGS, CHROMIUM


@pytest.fixture
def browser(monkeypatch):
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API keeps an event loop in this thread; the test's own ORM calls are
    # plain synchronous code all the same.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def pages(browser, tmp_path):
    """New pages; each one's last state is kept as tmp_path/last-N.png, to look at after a failure."""
    made = []

    def new_page(**context):
        context.setdefault("viewport", {"width": 1360, "height": 900})
        page = browser.new_context(**context).new_page()
        made.append(page)
        return page

    yield new_page
    for i, page in enumerate(made):
        with contextlib.suppress(Exception):
            page.screenshot(path=str(tmp_path / f"last-{i}.png"), full_page=True)


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("SHIFTLOG_SCREENSHOTS") or tmp_path / "shots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def eve(db):
    from django.test import override_settings

    # The servers use the real password hashers, not the tests' fast one.
    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.PBKDF2PasswordHasher"]):
        user = get_user_model().objects.create_user("eve", password="pw-eve-12345")
    for codename in ("decide_approval", "view_run", "control_run"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user
