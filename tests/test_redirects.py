"""Redirect targets from a request lead only to this site (dashboard/redirects.py)."""

from __future__ import annotations

import pytest

from agents.models import Approval
from tests.helpers import client_for


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/phish",
        "//evil.example/phish",
        "/\\evil.example",
        "\\\\evil.example",
        "javascript:alert(1)",
        "http://127.0.0.1:9999/",  # this host, another port: another site
        "https:evil.example",
        " //evil.example",
    ],
)
def test_the_decision_form_never_sends_a_person_elsewhere(supervisor, waiting_run, target):
    approval = Approval.objects.get()
    response = client_for(supervisor).post(
        f"/approvals/{approval.pk}/decide", {"decision": "approve", "next": target}
    )
    assert response.status_code == 302 and response.url == "/approvals/", response.url


def test_a_next_page_of_this_site_is_followed(supervisor, waiting_run):
    """The positive control: the form's own `next` (the page it was on) still works."""
    approval = Approval.objects.get()
    response = client_for(supervisor).post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "approve", "next": f"/runs/{waiting_run.pk}/"},
    )
    assert response.status_code == 302 and response.url == f"/runs/{waiting_run.pk}/"
