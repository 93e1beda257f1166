"""One vocabulary for a decision on every surface (agents/approvals.py): decision approve | edit
| deny, reason, input, allow_similar, the same in the web form, the API and the CLI."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client

from agents import services
from agents.models import Approval
from api.models import ApiToken
from tests.helpers import client_for, drive_until_idle

pytestmark = pytest.mark.django_db


def waiting(owner) -> Approval:
    run = drive_until_idle(services.create_demo_run(created_by=owner))
    return Approval.objects.get(run=run, status="pending")


def test_the_web_form_takes_the_apis_words(owner, supervisor):
    asked = waiting(owner)
    client_for(supervisor).post(
        f"/approvals/{asked.pk}/decide",
        {"decision": "edit", "input": '{"command": "rm -rf build"}', "reason": "only build"},
    )
    asked.refresh_from_db()
    assert asked.status == "approved" and asked.edited_input == {"command": "rm -rf build"}
    assert asked.comment == "only build"


def test_the_api_and_the_cli_take_the_same_words(owner, supervisor):
    first, second = waiting(owner), waiting(owner)
    _, token = ApiToken.issue(supervisor, ["read", "decide"])
    r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        f"/api/v1/approvals/{first.pk}/decision",
        json.dumps({"decision": "deny", "reason": "keep the cache"}),
        content_type="application/json",
    )
    assert r.status_code == 200, r.content
    out = StringIO()
    call_command("approve", str(second.pk), "--user", "sam", "--reason", "go ahead", stdout=out)
    first.refresh_from_db(), second.refresh_from_db()
    assert (first.status, first.comment) == ("denied", "keep the cache")
    assert (second.status, second.comment) == ("approved", "go ahead")


def test_a_page_from_before_still_decides(owner, supervisor):
    """Open pages keep the old field names until they reload: comment, edited."""
    asked = waiting(owner)
    client_for(supervisor).post(
        f"/approvals/{asked.pk}/decide", {"decision": "deny", "comment": "not now"}
    )
    asked.refresh_from_db()
    assert (asked.status, asked.comment) == ("denied", "not now")


def test_a_word_outside_the_vocabulary_is_refused_saying_which_are_in_it(owner, supervisor):
    asked = waiting(owner)
    r = client_for(supervisor).post(
        f"/approvals/{asked.pk}/decide", {"decision": "maybe"}, HTTP_HX_REQUEST="true"
    )
    assert r.status_code == 200 and "approve, edit, deny" in r.content.decode()
    asked.refresh_from_db()
    assert asked.status == "pending"
