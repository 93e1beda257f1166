"""Human-in-the-loop: approvals that really gate, decided by people with the right to."""

from __future__ import annotations

import json
import socket
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents import policy, reaper, services, tasks
from agents.approvals import ApprovalError, NotAllowed, can_decide, decide
from agents.models import Approval, Event, Run, RunStatus, WebhookDelivery
from agents.runtime.loop import drive
from tests.helpers import approve_pending, call, drive_until_idle, finish_turn, make_run
from tests.procs import dump_events, wait_for

pytestmark = pytest.mark.django_db

RISKY = "echo ran >> ran.txt; rm -rf build"


def risky_run(*more_turns, **kwargs):
    turns = [
        {"text": "Cleaning up.", "tool_calls": [call("bash", command=RISKY)]},
        *more_turns,
        finish_turn(),
    ]
    return make_run(turns=turns, **kwargs)


def results(run):
    return [e.payload for e in Event.objects.filter(run=run, kind="tool.result").order_by("seq")]


def test_a_risky_call_waits_without_running_and_without_a_worker(db):
    run = drive_until_idle(risky_run())
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert not (run.workspace_path / "ran.txt").exists()  # the tool has not run
    assert not run.lease_owner  # no worker holds it while a person thinks
    approval = Approval.objects.get(run=run)
    assert approval.status == "pending" and approval.tool_input["command"] == RISKY
    requested = Event.objects.get(run=run, kind="approval.requested")
    assert "deletes widely" in requested.payload["reason"]
    assert not Event.objects.filter(run=run, kind="tool.call").exists()
    assert run.sessions.get().status == "suspended"


def test_approve_runs_the_call_exactly_once(decider):
    run = drive_until_idle(risky_run())
    approval = approve_pending(run, decider)[0]
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED  # the decision queued a new slice
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert (run.workspace_path / "ran.txt").read_text() == "ran\n"
    calls = Event.objects.filter(run=run, kind="tool.call", payload__name="bash")
    assert calls.count() == 1 and calls.get().payload["approval_id"] == approval.pk
    decided = Event.objects.get(run=run, kind="approval.decided")
    assert decided.actor == "user:dana" and decided.payload["decision"] == "approved"


def test_deny_gives_the_agent_the_reason_and_it_carries_on(decider):
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    decide(approval.pk, user=decider, approve=False, comment="keep the build folder")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert not (run.workspace_path / "ran.txt").exists()
    denied = results(run)[0]
    assert denied["is_error"] and "keep the build folder" in denied["output"]


def test_edit_then_approve_runs_the_edited_command_and_records_the_diff(decider):
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    decide(
        approval.pk, user=decider, approve=True, edited_input={"command": "echo edited >> ran.txt"}
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert (run.workspace_path / "ran.txt").read_text() == "edited\n"
    call_event = Event.objects.get(run=run, kind="tool.call", payload__name="bash")
    assert call_event.payload["input"] == {"command": "echo edited >> ran.txt"}
    diff = Event.objects.get(run=run, kind="approval.decided").payload["diff"]
    assert "-echo ran >> ran.txt; rm -rf build" in diff and "+echo edited >> ran.txt" in diff
    assert "edited this call" in results(run)[0]["output"]


def test_an_invalid_edit_is_refused_and_the_approval_stays_pending(decider):
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    with pytest.raises(ApprovalError, match="not valid for bash"):
        decide(approval.pk, user=decider, approve=True, edited_input={"cmd": "ls"})
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_a_denial_needs_a_reason(decider):
    run = drive_until_idle(risky_run())
    with pytest.raises(ApprovalError, match="needs a reason"):
        decide(Approval.objects.get(run=run).pk, user=decider, approve=False, comment=" ")


def test_several_calls_in_one_turn_are_each_decided_and_the_run_resumes_after_the_last(decider):
    turn = {
        "tool_calls": [
            call("bash", command="curl -s example.com > a.txt"),
            call("write_file", path="b.txt", content="b"),
            call("bash", command="rm -rf old"),
        ]
    }
    run = drive_until_idle(make_run(turns=[turn, finish_turn()]))
    assert run.status == RunStatus.AWAITING_APPROVAL
    first, second = Approval.objects.filter(run=run).order_by("pk")
    assert (first.tool_input["command"], second.tool_input["command"]) == (
        "curl -s example.com > a.txt",
        "rm -rf old",
    )
    decide(second.pk, user=decider, approve=True)
    run.refresh_from_db()
    assert run.status == RunStatus.AWAITING_APPROVAL  # still one to go
    decide(first.pk, user=decider, approve=False, comment="no network")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    out = results(run)
    assert [r["name"] for r in out[:3]] == ["bash", "write_file", "bash"]  # the model's order
    assert out[0]["is_error"] and "no network" in out[0]["output"]


def test_a_second_decision_is_refused_naming_who_decided(decider):
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    decide(approval.pk, user=decider, approve=True)
    with pytest.raises(ApprovalError, match="already approved by dana"):
        decide(approval.pk, user=decider, approve=False, comment="too late")


def test_two_people_deciding_at_once_exactly_one_wins(transactional_db):
    from django.contrib.auth.models import Permission

    perm = Permission.objects.get(codename="decide_approval")
    people = []
    for name in ("ann", "bob", "cyd", "dee"):
        user = get_user_model().objects.create_user(name)
        user.user_permissions.add(perm)
        people.append(get_user_model().objects.get(pk=user.pk))
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    barrier = threading.Barrier(len(people))
    outcomes = []

    def attempt(user, approve):
        barrier.wait()
        try:
            decide(approval.pk, user=user, approve=approve, comment="" if approve else "no")
            outcomes.append(("won", user.username))
        except ApprovalError as e:
            outcomes.append(("refused", str(e)))
        finally:
            from django.db import connection

            connection.close()

    threads = [threading.Thread(target=attempt, args=(u, i % 2 == 0)) for i, u in enumerate(people)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [o for o in outcomes if o[0] == "won"]
    assert len(outcomes) == 4 and len(winners) == 1, outcomes
    assert Event.objects.filter(run=run, kind="approval.decided").count() == 1
    approval.refresh_from_db()
    assert approval.decided_by.username == winners[0][1]


def test_a_user_without_the_permission_cannot_decide(owner):
    run = drive_until_idle(risky_run())
    approval = Approval.objects.get(run=run)
    with pytest.raises(NotAllowed, match=r"needs agents\.decide_approval"):
        decide(approval.pk, user=owner, approve=True)
    with pytest.raises(CommandError, match="may not decide approvals") as info:
        call_command("approve", str(approval.pk), "--user", "olivia")
    assert info.value.returncode == 2
    approval.refresh_from_db()
    assert approval.status == "pending"


def test_allow_similar_adds_a_recorded_rule_and_approves_matching_waiting_calls(decider):
    turn = {
        "tool_calls": [call("bash", command="rm -rf build"), call("bash", command="rm -rf dist")]
    }
    later = {"tool_calls": [call("bash", command="rm -rf cache")]}
    run = drive_until_idle(make_run(turns=[turn, later, finish_turn()]))
    first, second = Approval.objects.filter(run=run).order_by("pk")
    decide(first.pk, user=decider, approve=True, allow_similar=True)
    second.refresh_from_db()
    assert second.status == "approved" and "allowed by rule" in second.comment
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED  # the later rm -rf did not ask again
    assert Approval.objects.filter(run=run).count() == 2
    run.refresh_from_db()
    assert run.tool_policy[0]["action"] == "allow" and run.tool_policy[0]["tool"] == "bash"
    change = Event.objects.get(run=run, kind="run.updated")
    assert change.actor == "user:dana" and change.payload["rule_added"] == run.tool_policy[0]


def test_a_deny_rule_answers_with_a_tool_error_explaining_it(db):
    run = risky_run(tool_policy=[{"tool": "bash", "pattern": r"rm -rf", "action": "deny"}])
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    first = results(run)[0]
    assert (
        first["is_error"]
        and "Denied by the tool policy" in first["output"]
        and "rm -rf" in first["output"]
    )
    assert not Approval.objects.exists()


def test_an_ask_rule_gates_a_tool_the_classifier_would_allow(db):
    run = make_run(
        turns=[
            {"tool_calls": [call("write_file", path="tests/test_x.py", content="x")]},
            finish_turn(),
        ],
        tool_policy=[{"tool": "write_file", "pattern": "^tests/", "action": "ask"}],
    )
    assert drive_until_idle(run).status == RunStatus.AWAITING_APPROVAL


def test_a_policy_change_while_running_is_an_event_and_takes_effect(decider):
    run = drive_until_idle(risky_run())
    services.set_policy(run.pk, [{"tool": "bash", "action": "allow"}], actor="user:dana")
    assert Event.objects.filter(run=run, kind="run.updated").get().actor == "user:dana"
    approve_pending(run, decider)
    later = make_run(turns=[{"tool_calls": [call("bash", command="rm -rf x")]}, finish_turn()])
    services.set_policy(later.pk, [{"tool": "bash", "action": "allow"}], actor="user:dana")
    assert drive_until_idle(later).status == RunStatus.SUCCEEDED
    with pytest.raises(services.RunError, match="action must be one of"):
        services.set_policy(later.pk, [{"tool": "bash", "action": "sure"}], actor="user:dana")


# Runs until the test creates `go` (15 s at most), so the test acts while the command runs.
WAIT_FOR_GO = (
    "i=0; while [ ! -f go ] && [ $i -lt 300 ]; do sleep 0.05; i=$((i+1)); done; "
    "echo first > first.txt"
)


def test_a_policy_changed_while_a_slice_runs_governs_the_next_tool_call_of_that_slice(
    transactional_db,
):
    from django.db import connection

    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=WAIT_FOR_GO)]},
            {"tool_calls": [call("bash", command="echo second > second.txt")]},
            finish_turn(),
        ]
    )
    outcome = []

    def one_slice():
        try:
            outcome.append(drive(run.pk))  # one slice, start to end: no new slice re-reads it
        finally:
            connection.close()

    worker = threading.Thread(target=one_slice)
    worker.start()
    try:
        wait_for(
            lambda: Event.objects.filter(run=run, kind="tool.call").exists(),
            timeout=30,
            what="the first tool call to start",
            details=lambda: dump_events(run.pk),
        )
        services.set_policy(
            run.pk, [{"tool": "bash", "pattern": "second", "action": "deny"}], actor="user:dana"
        )
    finally:
        (run.workspace_path / "go").touch()  # let the first command end
        worker.join(60)
    log = dump_events(run.pk)
    assert [o.status for o in outcome] == [RunStatus.SUCCEEDED], log
    assert (run.workspace_path / "first.txt").exists(), log
    change = Event.objects.get(run=run, kind="run.updated")
    calls = Event.objects.filter(run=run, kind="tool.call").order_by("seq")
    first, second = Event.objects.filter(run=run, kind="tool.result").order_by("seq")[:2]
    assert calls[0].seq < change.seq < first.seq, log  # changed while the first command ran
    assert second.payload["name"] == "bash" and not calls.filter(payload__name="bash")[1:], log
    assert second.payload["is_error"] and "Denied by the tool policy" in second.payload["output"]
    assert not (run.workspace_path / "second.txt").exists(), log


def test_an_expired_approval_counts_as_denied_and_pauses_the_run(db):
    run = drive_until_idle(risky_run(approval_timeout_seconds=60))
    approval = Approval.objects.get(run=run)
    assert approval.expires_at is not None
    reaper.reap(now=timezone.now() + timedelta(seconds=61))
    approval.refresh_from_db()
    run.refresh_from_db()
    assert approval.status == "expired"
    assert run.status == RunStatus.PAUSED and "expired" in run.status_reason
    with pytest.raises(ApprovalError, match="expired"):
        decide(approval.pk, user=get_user_model().objects.create_superuser("su"), approve=True)
    services.resume_run(run.pk, actor="user:olivia")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED
    assert "expired" in results(run)[0]["output"]
    assert not (run.workspace_path / "ran.txt").exists()


def test_no_expiry_by_default(db):
    run = drive_until_idle(risky_run())
    assert Approval.objects.get(run=run).expires_at is None


def test_the_global_approval_timeout_expires_approvals_of_runs_without_their_own(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "APPROVAL_TIMEOUT_SECONDS": 60}
    run = drive_until_idle(risky_run())
    own = drive_until_idle(risky_run(approval_timeout_seconds=600))
    soon = timezone.now() + timedelta(seconds=60)
    expires = Approval.objects.get(run=run).expires_at
    assert soon - timedelta(seconds=10) < expires <= soon
    assert Approval.objects.get(run=own).expires_at > soon + timedelta(seconds=500)
    reaper.reap(now=timezone.now() + timedelta(seconds=61))
    assert Approval.objects.get(run=run).status == "expired"
    assert Run.objects.get(pk=run.pk).status == RunStatus.PAUSED
    assert Approval.objects.get(run=own).status == "pending"  # the run's own timeout wins


def test_the_global_tool_policy_applies_after_the_runs_own_rules(settings):
    deny_rm = {"tool": "bash", "pattern": "rm -rf", "action": "deny"}
    settings.SHIFTLOG = {**settings.SHIFTLOG, "TOOL_POLICY": [deny_rm]}
    run = drive_until_idle(risky_run())
    assert run.status == RunStatus.SUCCEEDED
    denied = results(run)[0]
    assert denied["is_error"] and "Denied by the tool policy" in denied["output"]
    assert denied["data"]["rule"] == deny_rm
    assert not Approval.objects.filter(run=run).exists()
    ask_first = {"tool": "bash", "pattern": "rm -rf", "action": "ask"}
    own = drive_until_idle(risky_run(tool_policy=[ask_first]))
    assert own.status == RunStatus.AWAITING_APPROVAL  # the run's rule came first


def test_global_webhook_urls_get_every_runs_notifications_besides_its_own(
    settings, receiver, django_capture_on_commit_callbacks
):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_URLS": [receiver.url]}
    own = Receiver()
    try:
        queued_webhooks()
        with django_capture_on_commit_callbacks(execute=True):
            plain = drive_until_idle(make_run(turns=[finish_turn()]))
            with_own = drive_until_idle(make_run(turns=[finish_turn()], webhook_urls=[own.url]))
        assert [delivery(t).url for t in deliver_queued()] == [
            receiver.url,
            receiver.url,
            own.url,
        ]
        assert [(b["event"], b["run"]["id"]) for b in receiver.bodies] == [
            ("run.succeeded", plain.pk),
            ("run.succeeded", with_own.pk),
        ]
        assert [(b["event"], b["run"]["id"]) for b in own.bodies] == [
            ("run.succeeded", with_own.pk)
        ]
    finally:
        own.close()


def test_cli_lists_approves_and_denies_as_named_users(decider):
    from io import StringIO

    run = drive_until_idle(
        make_run(
            turns=[
                {
                    "tool_calls": [
                        call("bash", command="rm -rf a"),
                        call("bash", command="rm -rf b"),
                    ]
                },
                finish_turn(),
            ]
        )
    )
    out = StringIO()
    call_command("approvals", "--run", str(run.pk), stdout=out)
    assert "rm -rf a" in out.getvalue() and "rm -rf b" in out.getvalue()
    a, b = Approval.objects.filter(run=run).order_by("pk")
    call_command(
        "approve",
        str(a.pk),
        "--user",
        "dana",
        "--input",
        '{"command": "echo a"}',
        "--comment",
        "safer",
        stdout=StringIO(),
    )
    call_command("deny", str(b.pk), "--user", "dana", "--reason", "not b", stdout=StringIO())
    a.refresh_from_db()
    b.refresh_from_db()
    assert (a.status, a.edited_input, a.comment) == ("approved", {"command": "echo a"}, "safer")
    assert (b.status, b.comment) == ("denied", "not b")
    with pytest.raises(CommandError, match="not valid JSON"):
        call_command("approve", str(b.pk), "--user", "dana", "--input", "{oops")
    with pytest.raises(CommandError, match="no approval with id 999"):
        call_command("deny", "999", "--user", "dana", "--reason", "x")


def test_cli_approve_with_allow_similar_records_the_rule_and_approves_matching_calls(decider):
    from io import StringIO

    turn = {
        "tool_calls": [call("bash", command="rm -rf build"), call("bash", command="rm -rf dist")]
    }
    later = {"tool_calls": [call("bash", command="rm -rf cache")]}
    run = drive_until_idle(make_run(turns=[turn, later, finish_turn()]))
    first, second = Approval.objects.filter(run=run).order_by("pk")
    out = StringIO()
    call_command("approve", str(first.pk), "--user", "dana", "--allow-similar", stdout=out)
    assert f"approval {first.pk} approved" in out.getvalue()
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.decided_by) == ("approved", decider)
    assert second.status == "approved" and "allowed by rule" in second.comment
    change = Event.objects.get(run=run, kind="run.updated")
    assert change.actor == "user:dana"
    assert change.payload["because"].startswith(f"allow similar to approval {first.pk}: ")
    rule = change.payload["rule_added"]
    assert (rule["tool"], rule["action"]) == ("bash", "allow")
    # The rule in words is in the audit trail: exactly what it allows.
    assert "runs `rm` with exactly the flags -f -r" in change.payload["because"]
    assert (rule["program"], rule["flags"], rule["paths"]) == ("rm", ["-f", "-r"], "workspace")
    assert policy.decide([rule], "bash", {"command": "rm -rf cache"}).action == "allow"
    assert policy.decide([rule], "bash", {"command": "rm -rf /"}).action == "ask"
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED  # the later rm -rf cache did not ask
    assert Approval.objects.filter(run=run).count() == 2
    with pytest.raises(CommandError, match="already approved by dana"):
        call_command("approve", str(first.pk), "--user", "dana", "--allow-similar")


def test_audit_log_names_the_user_of_every_human_action(decider, owner):
    from io import StringIO

    run = drive_until_idle(risky_run())
    approve_pending(run, decider, comment="fine")
    services.note_run(run.pk, "keep going", actor="user:olivia")
    services.pause_run(run.pk, actor="user:olivia")
    services.resume_run(run.pk, actor="user:olivia")
    services.cancel_run(run.pk, actor="user:olivia")
    out = StringIO()
    call_command("audit_log", "--run", str(run.pk), "--json", stdout=out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["actor"], r["kind"]) for r in rows] == [
        ("user:dana", "approval.decided"),
        ("user:dana", "run.status"),
        ("user:olivia", "human.note"),
        ("user:olivia", "run.status"),
        ("user:olivia", "run.status"),
        ("user:olivia", "run.status"),
    ]
    text = StringIO()
    call_command(
        "audit_log", "--since", (timezone.now() - timedelta(minutes=5)).isoformat(), stdout=text
    )
    assert "approval.decided" in text.getvalue()
    with pytest.raises(CommandError, match="is not a time"):
        call_command("audit_log", "--since", "yesterday-ish")


@pytest.fixture(autouse=True)
def webhooks_may_reach_this_machine(settings):
    """The receivers here are on loopback, which a run's webhooks may not reach by default
    (tests/test_webhook_targets.py): these tests are about delivery, not about where."""
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ALLOW_PRIVATE": True}


class Receiver:
    """A local webhook receiver: answers with the given statuses in turn, records bodies."""

    def __init__(self, statuses=(), *, otherwise=200):
        self.statuses = list(statuses)
        self.bodies = []
        self.raw = []  # (body bytes, headers) of each POST, to check signatures
        self.times = []  # time.monotonic() of each POST
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.bodies.append(json.loads(body))
                receiver.raw.append((body, dict(self.headers)))
                receiver.times.append(time.monotonic())
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else otherwise)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    started = Receiver()
    yield started
    started.close()


def queued_webhooks():
    from huey.contrib.djhuey import HUEY

    tasks = []
    while (task := HUEY.dequeue()) is not None:
        if task.name.endswith("deliver_webhook"):
            tasks.append(task)
    return tasks


def delivery(task) -> WebhookDelivery:
    """The delivery row a queued deliver_webhook task stands for."""
    return WebhookDelivery.objects.get(pk=task.kwargs["delivery_id"])


def deliver_queued() -> list:
    """Run each queued webhook task's body once, as a worker would; returns the tasks."""
    queued = queued_webhooks()
    for task in queued:
        tasks.deliver_webhook.call_local(**task.kwargs)
    return queued


def in_seconds(eta) -> float:
    """How far in the future a huey eta (naive UTC) lies."""
    return (eta - datetime.now(UTC).replace(tzinfo=None)).total_seconds()


def assert_links_to_the_run_page(body, run):
    from django.conf import settings
    from django.urls import resolve

    assert body["url"].startswith(settings.SHIFTLOG_BASE_URL + "/")
    page = resolve(urlsplit(body["url"]).path)
    assert (page.url_name, page.kwargs) == ("run-detail", {"run_id": run.pk})


def test_webhooks_fire_on_an_approval_wait_and_on_success_with_a_link(
    decider, django_capture_on_commit_callbacks
):
    receiver = Receiver([500, 200, 200])
    try:
        queued_webhooks()  # start from an empty queue
        with django_capture_on_commit_callbacks(execute=True):
            run = drive_until_idle(risky_run(webhook_urls=[receiver.url]))
        queued = queued_webhooks()
        assert len(queued) == 1
        # A 500 first: the retry is scheduled, not waited for.
        assert not tasks.deliver_webhook.call_local(**queued[0].kwargs)
        retry = queued_webhooks()
        assert [delivery(t).attempts for t in retry] == [1] and retry[0].eta is not None
        assert retry[0].kwargs == queued[0].kwargs  # the same delivery, its next attempt
        assert tasks.deliver_webhook.call_local(**retry[0].kwargs)
        assert delivery(retry[0]).state == "delivered" and delivery(retry[0]).attempts == 2
        assert len(receiver.bodies) == 2
        first = receiver.bodies[-1]
        assert first["event"] == "approval.requested"
        assert_links_to_the_run_page(first, run)
        assert first["approvals"][0]["input"]["command"] == RISKY
        with django_capture_on_commit_callbacks(execute=True):
            approve_pending(run, decider)
            drive_until_idle(run)
        events = [delivery(t).payload["event"] for t in queued_webhooks()]
        assert events == ["run.succeeded"]
    finally:
        receiver.close()


def test_a_failed_webhook_attempt_schedules_the_next_after_a_doubling_backoff_without_sleeping(
    settings,
):
    # A backoff this long would stall the test for 90 s if an attempt slept before retrying.
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ATTEMPTS": 3, "WEBHOOK_BACKOFF_SECONDS": 30}
    receiver = Receiver(otherwise=500)
    try:
        run = make_run(turns=[finish_turn()])
        queued_webhooks()
        payload = {"event": "run.succeeded", "url": "x"}
        delays = []
        row = WebhookDelivery.objects.create(run=run, url=receiver.url, payload=payload)
        task_kwargs = {"delivery_id": row.pk}
        for attempt in (1, 2):
            started = time.monotonic()
            assert not tasks.deliver_webhook.call_local(**task_kwargs)
            assert time.monotonic() - started < 10, "the task waited (30 s) instead of scheduling"
            (retry,) = queued_webhooks()
            assert retry.kwargs == task_kwargs and delivery(retry).attempts == attempt
            delays.append(in_seconds(retry.eta))
            # Not due yet: a task for it that comes early (a second one, say) makes no attempt.
            assert not tasks.deliver_webhook.call_local(**task_kwargs)
            assert len(receiver.bodies) == attempt
            WebhookDelivery.objects.filter(pk=row.pk).update(due_at=timezone.now())
            assert not Event.objects.filter(run=run, kind="notification.failed").exists()
        assert 28 < delays[0] <= 30 and 58 < delays[1] <= 60, delays  # 30 s, then doubled
        assert not tasks.deliver_webhook.call_local(**task_kwargs)  # the last attempt
        assert delivery(retry).state == "failed" and delivery(retry).last_error == "HTTP 500"
        assert not tasks.deliver_webhook.call_local(**task_kwargs)  # given up: nothing more
        assert queued_webhooks() == []
        assert len(receiver.bodies) == 3
        failed = Event.objects.get(run=run, kind="notification.failed")
        assert failed.payload == {
            "url": receiver.url,
            "event": "run.succeeded",
            "attempts": 3,
            "error": "HTTP 500",
        }
    finally:
        receiver.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.django_db(transaction=True)
def test_a_webhook_that_keeps_failing_holds_no_worker_thread_while_it_waits_to_retry(procs):
    receiver = Receiver(otherwise=500)
    try:
        noisy = make_run(turns=[finish_turn()], webhook_urls=[receiver.url])
        other = make_run(turns=[finish_turn()])
        # One worker thread: an attempt that slept before the next would hold up every run.
        procs.consumer(
            workers=1,
            SHIFTLOG_WEBHOOK_ATTEMPTS=3,
            SHIFTLOG_WEBHOOK_BACKOFF=3,
            SHIFTLOG_WEBHOOK_ALLOW_PRIVATE=1,
        )
        procs.enqueue(noisy.pk)

        def details() -> str:
            return f"{dump_events(noisy.pk)}\n{procs.logs()}"

        wait_for(lambda: receiver.bodies, timeout=30, what="the first attempt", details=details)
        procs.enqueue(other.pk)
        wait_for(
            lambda: Run.objects.get(pk=other.pk).status == RunStatus.SUCCEEDED,
            timeout=30,
            what="the other run to succeed",
            details=lambda: f"{dump_events(other.pk)}\n{procs.logs()}",
        )
        # The last attempt is due 3 + 6 s after the first: the other run did not wait for it.
        assert len(receiver.bodies) < 3, receiver.times
        failed = wait_for(
            lambda: Event.objects.filter(run=noisy, kind="notification.failed").first(),
            timeout=30,
            what="the notification.failed event",
            details=details,
        )
        assert failed.payload == {
            "url": receiver.url,
            "event": "run.succeeded",
            "attempts": 3,
            "error": "HTTP 500",
        }
        assert len(receiver.bodies) == 3 and receiver.bodies[0]["event"] == "run.succeeded"
        waits = [b - a for a, b in pairwise(receiver.times)]
        # The backoff doubles. Only lower bounds: a retry may come late on a loaded machine
        # (huey's scheduler looks every second), never early.
        assert waits[0] >= 2.9 and waits[1] >= 5.9 and waits[1] > waits[0], waits
    finally:
        receiver.close()


def dead_url() -> str:
    """A local URL nothing listens on (the port was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/hook"


def test_a_webhook_nobody_listens_on_is_an_event_after_its_only_attempt(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ATTEMPTS": 1}
    run = make_run(turns=[finish_turn()])
    queued_webhooks()
    dead = dead_url()
    assert not tasks.deliver_webhook.call_local(run_id=run.pk, url=dead, payload={"event": "x"})
    assert queued_webhooks() == []
    failed = Event.objects.get(run=run, kind="notification.failed")
    assert failed.payload["url"] == dead and "refused" in failed.payload["error"].lower()


def test_a_webhook_url_that_is_not_http_is_an_event_never_a_crashed_task_or_a_file_read(
    settings, tmp_path
):
    # Start-up refuses such URLs in SHIFTLOG_WEBHOOK_URLS (tests/test_settings.py); should one
    # get as far as a delivery anyway, it is refused there too, and said so in the log.
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ATTEMPTS": 1}
    run = make_run(turns=[finish_turn()])
    queued_webhooks()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not read me")
    for url in ("hooks.example/x", f"file://{secret}", "ftp://example.org/x"):
        assert not tasks.deliver_webhook.call_local(run_id=run.pk, url=url, payload={"event": "x"})
        failed = Event.objects.get(run=run, kind="notification.failed", payload__url=url)
        assert "not an http:// or https:// URL" in failed.payload["error"]


def test_a_run_that_pauses_posts_a_webhook_saying_why_with_a_link_to_the_run(
    receiver, django_capture_on_commit_callbacks
):
    queued_webhooks()
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(
            make_run(
                turns=[{"tool_calls": [call("bash", command="true")]}, finish_turn()],
                budgets=services.Budgets(max_tokens=1),
                webhook_urls=[receiver.url],
            )
        )
    assert run.status == RunStatus.PAUSED
    assert [delivery(t).url for t in deliver_queued()] == [receiver.url]
    (body,) = receiver.bodies
    assert body["event"] == "run.paused"
    assert body["run"]["id"] == run.pk and body["run"]["status"] == "paused"
    assert "max tokens (1) reached" in body["run"]["reason"] and body["previous"] == "running"
    assert_links_to_the_run_page(body, run)


def test_a_run_that_fails_posts_a_webhook_saying_why_with_a_link_to_the_run(
    receiver, django_capture_on_commit_callbacks
):
    queued_webhooks()
    with django_capture_on_commit_callbacks(execute=True):
        # The script ends without the agent finishing: the run fails, saying so.
        run = drive_until_idle(
            make_run(
                turns=[{"tool_calls": [call("bash", command="true")]}],
                webhook_urls=[receiver.url],
            )
        )
    assert run.status == RunStatus.FAILED
    deliver_queued()
    (body,) = receiver.bodies
    assert body["event"] == "run.failed"
    assert body["run"]["id"] == run.pk and body["run"]["status"] == "failed"
    assert body["run"]["reason"] == run.status_reason and "script" in body["run"]["reason"]
    assert_links_to_the_run_page(body, run)


def test_bad_webhook_urls_and_policies_are_refused_at_creation(db):
    with pytest.raises(services.RunError, match="must be an http"):
        make_run(turns=[finish_turn()], webhook_urls=["ftp://x"])
    with pytest.raises(services.RunError, match="tool policy: rule 1"):
        make_run(turns=[finish_turn()], tool_policy=[{"tool": "bash", "action": "nope"}])
    assert not Run.objects.exists()


def test_deciding_costs_the_same_few_queries_however_many_calls_wait(decider, owner):
    """The decision path is guarded against growing queries: one approval decided costs the
    same whether it is the only one waiting or one of several, and the last one costs only the
    run's move back to the queue on top."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    many = make_run(
        turns=[{"tool_calls": [call("bash", command=f"rm -rf build{i}") for i in range(5)]}],
        created_by=owner,
    )
    many = drive_until_idle(many)
    waiting = list(Approval.objects.filter(run=many, status="pending").order_by("pk"))
    assert len(waiting) == 5, many.status_reason
    assert can_decide(decider)  # the user's permissions, read once and cached
    counts = []
    for approval in waiting:
        with CaptureQueriesContext(connection) as queries:
            decide(approval.pk, user=decider, approve=True)
        counts.append(len(queries))
    assert counts[:-1] == [counts[0]] * 4, counts  # not one more query per call waiting
    assert counts[0] <= 11 and counts[-1] <= counts[0] + 9, counts


def test_webhooks_are_signed_to_the_standard_webhooks_scheme(receiver, settings):
    from standardwebhooks.webhooks import Webhook, WebhookVerificationError

    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ATTEMPTS": 2, "WEBHOOK_BACKOFF_SECONDS": 0}
    run = make_run(turns=[finish_turn()], webhook_urls=[receiver.url])
    payload = {"id": "msg_test_1", "event": "run.succeeded", "run": {"id": run.pk}}
    receiver.statuses = [500]  # the first attempt fails: the retry carries the same id
    assert not tasks.deliver_webhook.call_local(run_id=run.pk, url=receiver.url, payload=payload)
    assert tasks.deliver_webhook.call_local(
        run_id=run.pk, url=receiver.url, payload=payload, attempt=2
    )
    verifier = Webhook(settings.SHIFTLOG["WEBHOOK_SECRET"])
    for body, headers in receiver.raw:
        headers = {k.lower(): v for k, v in headers.items()}
        assert headers["webhook-id"] == "msg_test_1"
        assert verifier.verify(body, headers)["event"] == "run.succeeded"
    body, headers = receiver.raw[-1]
    headers = {k.lower(): v for k, v in headers.items()}
    with pytest.raises(WebhookVerificationError):  # a changed body fails the check
        verifier.verify(body.replace(b"succeeded", b"failed"), headers)
    with pytest.raises(WebhookVerificationError):  # so does another key
        Webhook("whsec_" + "A" * 44).verify(body, headers)


def test_every_notification_has_its_own_id(receiver, django_capture_on_commit_callbacks):
    queued_webhooks()
    with django_capture_on_commit_callbacks(execute=True):
        drive_until_idle(make_run(turns=[finish_turn()], webhook_urls=[receiver.url]))
    ids = [delivery(t).payload["id"] for t in queued_webhooks()]
    assert ids and all(i.startswith("msg_") for i in ids) and len(set(ids)) == len(ids)


def test_a_delivery_whose_task_was_lost_is_queued_again_by_the_reaper_and_made_once(
    receiver, django_capture_on_commit_callbacks
):
    from datetime import timedelta

    from django.conf import settings

    queued_webhooks()
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(make_run(turns=[finish_turn()], webhook_urls=[receiver.url]))
    (row,) = WebhookDelivery.objects.filter(run=run)
    assert row.payload["event"] == "run.succeeded" and row.state == "pending"
    assert len(queued_webhooks()) == 1  # ...and lost: Redis restarted without persistence
    # Not yet due long enough: the reaper leaves it to its task.
    reaper.reap()
    assert queued_webhooks() == []
    later = timezone.now() + timedelta(seconds=settings.SHIFTLOG["REQUEUE_AFTER_SECONDS"] + 1)
    reaper.reap(later)
    again = queued_webhooks()
    assert [t.kwargs for t in again] == [{"delivery_id": row.pk}]
    # Queued twice over (the reaper and a late task): one POST.
    assert tasks.deliver_webhook.call_local(**again[0].kwargs)
    assert not tasks.deliver_webhook.call_local(**again[0].kwargs)
    assert [b["event"] for b in receiver.bodies] == ["run.succeeded"]
    row.refresh_from_db()
    assert row.state == "delivered" and row.attempts == 1
    reaper.reap(later + timedelta(hours=1))
    assert queued_webhooks() == []  # delivered: nothing more to do


def test_an_attempt_under_way_is_not_made_again_until_it_would_have_timed_out(receiver):
    from datetime import timedelta

    run = make_run(turns=[finish_turn()])
    row = WebhookDelivery.objects.create(run=run, url=receiver.url, payload={"event": "x"})
    queued_webhooks()
    # A worker claimed it and died mid-POST: the claim holds the delivery a while...
    WebhookDelivery.objects.filter(pk=row.pk).update(due_at=timezone.now() + timedelta(seconds=20))
    assert not tasks.deliver_webhook.call_local(delivery_id=row.pk)
    assert receiver.bodies == []
    # ...then, once it would have timed out long ago, the reaper finds it and it is made.
    WebhookDelivery.objects.filter(pk=row.pk).update(due_at=timezone.now() - timedelta(minutes=10))
    reaper.reap()
    (task,) = queued_webhooks()
    assert tasks.deliver_webhook.call_local(**task.kwargs)
    assert len(receiver.bodies) == 1
