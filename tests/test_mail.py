"""Mail: approvals and run endings mailed through Django's email backend (locmem here) to the
people who opted in, with one-time signed links followed through the real views."""

from __future__ import annotations

import re
import time

import pytest
from django.core import signing
from django.test import Client

from agents import approvals, mail
from agents.models import Approval, MailLink, Reach
from tests.helpers import call, drain, drive_until_idle, finish_turn, make_run, user_with

pytestmark = pytest.mark.django_db


@pytest.fixture
def mailing(settings, mailoutbox):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.SHIFTLOG = {
        **settings.SHIFTLOG,
        "SLACK_BOT_TOKEN": "",
        "MAIL_NOTIFICATIONS": True,
        "MAIL_DIGEST_AFTER": 3,
    }
    drain()
    return mailoutbox


def person(name: str, *perms: str, approvals_mail=True, endings_mail=False):
    user = user_with(name, *perms)
    user.email = f"{name}@example.com"
    user.save()
    Reach.objects.create(user=user, mail_approvals=approvals_mail, mail_run_endings=endings_mail)
    return user


def asking(capture, *commands: str, goal: str = "tidy <script>alert(1)</script> up"):
    turns = [{"text": "Go.", "tool_calls": [call("bash", command=c) for c in commands]}]
    with capture(execute=True):
        run = drive_until_idle(make_run(turns=[*turns, finish_turn()], goal=goal))
    assert run.status == "awaiting_approval"
    return run


def link_path(message) -> str:
    return re.search(r"https?://[^/\s]+(/approvals/mail/[^\s]+/)", message.body).group(1)


def test_an_approval_is_mailed_to_who_opted_in_and_may_decide(
    mailing, django_capture_on_commit_callbacks
):
    person("dana", "decide_approval", "view_run")
    person("vic", "view_run")  # opted in, may not decide: no mail
    person("sam", "decide_approval", "view_run", approvals_mail=False)  # did not opt in
    run = asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    assert drain() == ["mail_approvals"]
    [message] = mailing
    assert message.to == ["dana@example.com"]
    assert f"run {run.pk} asks to use bash" in message.subject
    assert "rm -rf build" in message.body and "<script>alert(1)</script>" in message.body
    [(html, kind)] = message.alternatives
    assert kind == "text/html"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    assert link_path(message) in html


def test_the_link_opens_the_decision_after_login_and_works_once(
    mailing, django_capture_on_commit_callbacks
):
    dana = person("dana", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    path = link_path(mailing[0])
    anonymous = Client().get(path)
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]

    browser = Client()
    browser.force_login(dana)
    page = browser.get(path)
    assert page.status_code == 200 and b'name="decision" value="deny"' in page.content
    approval = Approval.objects.get()
    assert approval.status == "pending"  # opening the link decides nothing

    no_reason = browser.post(path, {"decision": "deny", "reason": ""})
    assert no_reason.status_code == 409 and b"needs a reason" in no_reason.content
    assert MailLink.objects.get().used_at is None  # nothing decided: still good

    denied = browser.post(path, {"decision": "deny", "reason": "not on a Friday"})
    assert denied.status_code == 200 and b"Denied by dana" in denied.content
    approval.refresh_from_db()
    assert (approval.status, approval.decided_by, approval.comment) == (
        "denied",
        dana,
        "not on a Friday",
    )
    again = browser.get(path)
    assert again.status_code == 410 and b"already used" in again.content
    replay = browser.post(path, {"decision": "approve"})
    assert replay.status_code == 410
    approval.refresh_from_db()
    assert approval.status == "denied"


def test_a_link_sent_to_someone_else_is_refused(mailing, django_capture_on_commit_callbacks):
    person("dana", "decide_approval", "view_run")
    sam = user_with("sam", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    browser = Client()
    browser.force_login(sam)
    path = link_path(mailing[0])
    assert browser.get(path).status_code == 403
    refused = browser.post(path, {"decision": "approve"})
    assert refused.status_code == 403 and b"sent to someone else" in refused.content
    assert Approval.objects.get().status == "pending"


def test_an_expired_or_forged_link_is_refused(mailing, django_capture_on_commit_callbacks):
    dana = person("dana", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    link = MailLink.objects.get()

    class Yesterday(signing.TimestampSigner):
        def timestamp(self):
            return signing.b62_encode(int(time.time()) - 2 * 86400)

    old = Yesterday(salt=mail.SALT).sign(str(link.pk))
    browser = Client()
    browser.force_login(dana)
    expired = browser.post(f"/approvals/mail/{old}/", {"decision": "approve"})
    assert expired.status_code == 410 and b"expired" in expired.content
    forged = browser.get(f"/approvals/mail/{link.pk}:1abcde:forged/")
    assert forged.status_code == 400 and b"not valid" in forged.content
    assert Approval.objects.get().status == "pending"
    assert MailLink.objects.get().used_at is None


def test_a_link_to_an_approval_decided_elsewhere_says_who_decided(
    mailing, django_capture_on_commit_callbacks
):
    dana = person("dana", "decide_approval", "view_run")
    sam = user_with("sam", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    approvals.decide_as(Approval.objects.get().pk, user=sam, decision="approve")
    browser = Client()
    browser.force_login(dana)
    page = browser.get(link_path(mailing[0]))
    assert page.status_code == 200 and b"Approved by sam" in page.content
    assert b'name="decision"' not in page.content


def test_many_waiting_approvals_go_out_as_one_digest(mailing, django_capture_on_commit_callbacks):
    person("dana", "decide_approval", "view_run")
    commands = [f"echo {i} >> ran.txt; rm -rf build{i}" for i in range(5)]
    asking(django_capture_on_commit_callbacks, *commands)
    assert drain() == ["mail_approvals", "mail_digest"]
    assert len(mailing) == 4  # three one by one, then the digest of the other two
    digest = mailing[-1]
    assert digest.subject == "[Shiftlog] 2 approvals wait for you"
    assert digest.body.count("/approvals/mail/") == 2 and "rm -rf build4" in digest.body
    assert MailLink.objects.filter(mailed_at=None).count() == 0


def test_a_run_ending_is_mailed_to_who_opted_in_and_may_see_it(
    mailing, django_capture_on_commit_callbacks
):
    person("vic", "view_run", approvals_mail=False, endings_mail=True)
    person("otto", approvals_mail=False, endings_mail=True)  # may not see others' runs
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert drain() == ["mail_run_ended"]
    [message] = mailing
    assert message.to == ["vic@example.com"]
    assert message.subject == f"[Shiftlog] run {run.pk} succeeded"
    assert f"/runs/{run.pk}/" in message.body and message.alternatives


def test_the_cli_sets_where_people_and_projects_are_reached(db):
    from io import StringIO

    from django.core.management import CommandError, call_command

    from agents.models import ProjectReach

    user_with("dana", "decide_approval")
    out = StringIO()
    call_command("reach", user="dana", slack_id="U0DANA", mail_approvals="on", stdout=out)
    call_command("reach", project="infra", channel="C0INFRA", stdout=out)
    row = Reach.objects.get(user__username="dana")
    assert (row.slack_user_id, row.mail_approvals, row.mail_run_endings) == ("U0DANA", True, False)
    assert ProjectReach.objects.get(project="infra").slack_channel == "C0INFRA"
    assert "person dana: Slack U0DANA, mail approvals" in out.getvalue()
    user_with("sam")
    with pytest.raises(CommandError, match="already someone else's"):
        call_command("reach", user="sam", slack_id="U0DANA", stdout=out)
    with pytest.raises(CommandError, match="no user"):
        call_command("reach", user="nobody", stdout=out)


def test_the_link_page_approves_an_edited_input_checked_as_the_inbox_does(
    mailing, django_capture_on_commit_callbacks
):
    dana = person("dana", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    path = link_path(mailing[0])
    browser = Client()
    browser.force_login(dana)
    page = browser.get(path)
    assert b'name="decision" value="edit"' in page.content
    assert b"&quot;command&quot;" in page.content  # the input as JSON, escaped, to edit

    bad = browser.post(path, {"decision": "edit", "input": "{not json"})
    assert bad.status_code == 409 and b"JSON object" in bad.content
    assert b"{not json" in bad.content  # what they typed is there to fix
    not_object = browser.post(path, {"decision": "edit", "input": '["ls"]'})
    assert not_object.status_code == 409 and b"must be a JSON object" in not_object.content
    wrong_tool_input = browser.post(path, {"decision": "edit", "input": '{"cmd": "ls"}'})
    assert wrong_tool_input.status_code == 409 and b"not valid for bash" in wrong_tool_input.content
    empty = browser.post(path, {"decision": "edit", "input": "  "})
    assert empty.status_code == 409 and b"needs the whole edited input" in empty.content
    approval = Approval.objects.get()
    assert approval.status == "pending" and MailLink.objects.get().used_at is None

    edited = browser.post(path, {"decision": "edit", "input": '{"command": "echo x >> ran.txt"}'})
    assert edited.status_code == 200 and b"Approved by dana" in edited.content
    assert b"(with edits)" in edited.content
    approval.refresh_from_db()
    assert approval.status == "approved"
    assert approval.edited_input == {"command": "echo x >> ran.txt"}
    assert MailLink.objects.get().used_at is not None
    assert browser.post(path, {"decision": "edit", "input": "{}"}).status_code == 410


def test_the_link_page_offers_no_edit_where_the_subject_cannot_be_edited(
    mailing, django_capture_on_commit_callbacks
):
    from agents.models import ApprovalSubject

    dana = person("dana", "decide_approval", "view_run")
    asking(django_capture_on_commit_callbacks, "echo x >> ran.txt; rm -rf build")
    drain()
    # As a change to how the checks run is asked (tests/test_config_approval.py makes real ones).
    Approval.objects.update(subject=ApprovalSubject.CONFIG_CHANGE)
    path = link_path(mailing[0])
    browser = Client()
    browser.force_login(dana)
    page = browser.get(path)
    assert b'value="edit"' not in page.content and b"not edited" in page.content
    refused = browser.post(path, {"decision": "edit", "input": '{"command": "ls"}'})
    assert refused.status_code == 409 and b"approved or denied, not edited" in refused.content
    assert Approval.objects.get().status == "pending"
    assert MailLink.objects.get().used_at is None
    unknown = browser.post(path, {"decision": "maybe"})
    assert unknown.status_code == 409 and b"Choose Approve" in unknown.content
