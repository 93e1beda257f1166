"""Approvals under abuse (issue 31): what a run asked ends with the run, a decision on an ended
run is refused with its reason (never a 500), one command or run cannot flood the inbox, the
inbox is paged and fair between runs, policy changes are recorded as changes, and policy
patterns cannot hang a worker."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from agents import access, approvals, lifecycle, reaper, rewinds, services
from agents.models import Approval, Checkpoint, Event, Run, RunStatus
from agents.overview import compute
from api.models import ApiToken
from tests.helpers import (
    call,
    client_for,
    drive_until_idle,
    finish_turn,
    make_run,
    script,
    user_with,
)

pytestmark = pytest.mark.django_db

RISKY = "rm -rf build"


@pytest.fixture
def boss(db):
    """Sees every run, controls and decides."""
    return user_with("bea", "view_run", "control_run", "decide_approval")


def waiting(**kwargs) -> Run:
    turns = [{"tool_calls": [call("bash", command=RISKY)]}, finish_turn()]
    run = drive_until_idle(make_run(turns=turns, **kwargs))
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    return run


def decided(run: Run) -> list[dict]:
    return [
        e.payload for e in Event.objects.filter(run=run, kind="approval.decided").order_by("seq")
    ]


def assert_nothing_waits(run: Run, user) -> None:
    """Off the inbox, the header's count, the overview and the runs list; not decidable."""
    assert not Approval.objects.filter(run=run, status="pending").exists()
    assert access.pending_count(user) == 0
    figures = compute(access.visible_runs(user), access.pending_approvals(user))
    assert figures.approvals_waiting == 0 and figures.approvals == []
    assert Run.objects.for_list().get(pk=run.pk).pending_approvals == 0
    page = client_for(user).get("/approvals/").content.decode()
    assert f"run-{run.pk}" not in page and RISKY not in page
    for a in Approval.objects.filter(run=run):
        assert a.status == "discarded" and "the run ended" in a.comment
        with pytest.raises(approvals.ApprovalError, match="can no longer be decided"):
            approvals.decide(a.pk, user=user, approve=True)
    assert not [p for p in decided(run) if p["decision"] in ("approved", "denied")]


# --- 6: approvals end with their run ---------------------------------------------------------
def test_cancelling_a_waiting_run_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    services.cancel_run(run.pk, actor="user:bea")
    assert_nothing_waits(run, boss)
    (payload,) = decided(run)
    assert payload["decision"] == "discarded" and payload["comment"].endswith("(cancelled)")


def test_cancelling_a_run_after_pausing_it_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    services.pause_run(run.pk, actor="user:bea")
    assert Approval.objects.get(run=run).status == "pending"  # a pause keeps what waits
    services.cancel_run(run.pk, actor="user:bea")
    assert_nothing_waits(run, boss)


def test_cancelling_the_scripted_demo_from_the_cli_discards_and_approve_is_refused(boss):
    run = drive_until_idle(services.create_demo_run(created_by=boss))
    assert run.status == RunStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(run=run)
    call_command("cancel_run", str(run.pk), "--user", "bea")
    assert_nothing_waits(run, boss)
    with pytest.raises(CommandError, match="can no longer be decided") as refused:
        call_command("approve", str(approval.pk), "--user", "bea")
    assert "continues" not in str(refused.value)
    with pytest.raises(CommandError, match="can no longer be decided"):
        call_command("deny", str(approval.pk), "--user", "bea", "--reason", "no")


def test_a_run_that_fails_discards_its_approvals(boss):
    run = waiting(created_by=boss)
    lifecycle.transition(run.pk, RunStatus.FAILED, actor="harness", reason="a crash")
    assert_nothing_waits(run, boss)


def test_a_fleet_child_cancelled_by_its_parents_rewind_discards_its_approvals(
    boss, django_capture_on_commit_callbacks
):
    kid_script = script({"tool_calls": [call("bash", command=RISKY)]}, finish_turn())
    spawn = {
        "tool_calls": [
            call(
                "spawn_runs",
                children=[{"goal": "tidy", "checks": ["true"], "script": kid_script}],
                wait="all",
            )
        ]
    }
    parent = drive_until_idle(make_run(created_by=boss, turns=[spawn, finish_turn()]))
    assert parent.status == RunStatus.WAITING_FOR_CHILDREN, parent.status_reason
    (kid,) = Run.objects.filter(parent=parent)
    kid = drive_until_idle(kid)
    assert kid.status == RunStatus.AWAITING_APPROVAL, kid.status_reason
    assert access.pending_count(boss) == 1
    start = Checkpoint.objects.get(run=parent, kind="run_start")
    with django_capture_on_commit_callbacks(execute=True):
        rewinds.rewind(parent.pk, start.pk, actor="user:bea")
    kid.refresh_from_db()
    assert kid.status == RunStatus.CANCELLED
    assert_nothing_waits(kid, boss)
    fleet_page = client_for(boss).get(f"/runs/{parent.pk}/").content.decode()
    assert f'id="fleet-run-{kid.pk}"' in fleet_page and " waiting</a>" not in fleet_page


def test_approvals_an_older_version_left_on_ended_runs_are_refused_and_swept(boss):
    """A pending approval on an ended run (written before the end discarded them): a decision
    is refused with the reason on every path (API 409, web a message, CLI an error), and the
    reaper's next pass discards it."""
    run = waiting(created_by=boss)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.CANCELLED)  # as an older version left it
    approval = Approval.objects.get(run=run)
    _, token = ApiToken.issue(boss, ["read", "decide"])
    from django.test import Client

    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    r = api.post(
        f"/api/v1/approvals/{approval.pk}/decision",
        json.dumps({"decision": "approve"}),
        content_type="application/json",
    )
    assert r.status_code == 409, r.content
    assert f"run {run.pk} is cancelled" in r.json()["detail"]
    web = client_for(boss)
    r = web.post(f"/approvals/{approval.pk}/decide", {"decision": "approve"}, follow=True)
    assert r.status_code == 200 and "can no longer be decided" in r.content.decode()
    r = web.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "deny", "comment": "no"},
        HTTP_HX_REQUEST="true",
    )
    assert r.status_code == 200 and "can no longer be decided" in r.content.decode()
    with pytest.raises(CommandError, match="can no longer be decided"):
        call_command("approve", str(approval.pk), "--user", "bea")
    assert Approval.objects.get(pk=approval.pk).status == "pending"
    assert not decided(run)

    reaper.reap()
    assert_nothing_waits(run, boss)


# --- 5: flooding -------------------------------------------------------------------------------
@pytest.fixture
def caps(settings):
    def set_caps(per_command: int = 20, per_run: int = 100) -> None:
        settings.SHIFTLOG = {
            **settings.SHIFTLOG,
            "APPROVALS_PER_COMMAND": per_command,
            "APPROVALS_PER_RUN": per_run,
        }

    return set_caps


def results(run: Run) -> list[dict]:
    return [e.payload for e in Event.objects.filter(run=run, kind="tool.result").order_by("seq")]


def test_one_turn_asking_past_the_cap_asks_nobody_and_pauses_saying_why(boss, caps):
    caps(per_command=3)
    flood = {
        "tool_calls": [
            call("write_file", path="ok.txt", content="ok"),
            *[call("bash", command=f"rm -rf build{i}") for i in range(4)],
        ]
    }
    run = drive_until_idle(make_run(created_by=boss, turns=[flood, finish_turn()]))
    assert run.status == RunStatus.PAUSED
    assert "one command asked for 4 approvals at once (at most 3" in run.status_reason
    assert not Approval.objects.filter(run=run).exists()
    assert (run.workspace_path / "ok.txt").read_text() == "ok"  # the allowed call ran
    refused = results(run)[1:]
    assert len(refused) == 4 and all(
        r["is_error"] and r["output"].startswith("Not asked of a person") for r in refused
    )
    services.resume_run(run.pk, actor="user:bea")
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert len(results(run)) == 1 + 4 + 1  # nothing refused is planned again after the resume


def test_a_run_asking_past_its_cap_pauses_and_a_persons_resume_starts_the_count_again(boss, caps):
    caps(per_run=2)
    risky = [{"tool_calls": [call("bash", command=f"rm -rf b{i}")]} for i in range(4)]
    run = drive_until_idle(make_run(created_by=boss, turns=[*risky, finish_turn()]))
    for _ in range(2):
        assert run.status == RunStatus.AWAITING_APPROVAL
        approvals.decide(run.approvals.get(status="pending").pk, user=boss, approve=True)
        run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED
    assert "the run asked for 3 approvals since it was last resumed (at most 2" in (
        run.status_reason
    )
    assert run.approvals.count() == 2
    services.resume_run(run.pk, actor="user:bea")
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL  # the next call is asked again
    assert run.approvals.filter(status="pending").count() == 1


def test_a_command_reaching_more_new_hosts_than_the_cap_asks_nobody_and_pauses(
    boss, caps, settings
):
    from agents.sandbox import isolation_available

    if isolation_available() != "bwrap":
        pytest.skip("bubblewrap is not usable here: no egress proxy")
    caps(per_command=3)
    settings.SHIFTLOG = {**settings.SHIFTLOG, "EGRESS_ALLOW_PRIVATE": True}
    many = "for p in 1 2 3 4 5; do curl -s -m 5 -o /dev/null http://127.0.0.2:$p/; done; echo done"
    run = drive_until_idle(
        make_run(
            created_by=boss,
            turns=[{"tool_calls": [call("bash", command=many)]}, finish_turn()],
            tool_policy=[{"tool": "bash", "action": "allow"}],
        )
    )
    assert run.status == RunStatus.PAUSED, run.status_reason
    assert "one command asked for 5 approvals at once (at most 3" in run.status_reason
    assert not Approval.objects.filter(run=run).exists()
    told = Event.objects.get(run=run, kind="harness.message", payload__reason="approval_flood")
    assert "Connections to 5 new hosts were refused" in told.payload["text"]
    services.resume_run(run.pk, actor="user:bea")
    assert drive_until_idle(run).status == RunStatus.SUCCEEDED


def pending_rows(run: Run, n: int, *, tool: str = "bash") -> list[Approval]:
    """`n` waiting calls of `run`, as many turns' asks would leave them."""
    return [
        Approval.objects.create(
            run=run,
            tool_use_id=f"toolu_{run.pk}_{i}",
            tool_name=tool,
            subject="tool_call" if tool == "bash" else "network_host",
            tool_input={"command": f"rm -rf part{i}"}
            if tool == "bash"
            else {"host": f"h{i}.example", "port": 443},
        )
        for i in range(n)
    ]


def test_the_inbox_is_paged_and_one_run_cannot_bury_anothers_cards(boss):
    from dashboard import inbox

    flooder = make_run(created_by=boss, goal="floods")
    pending_rows(flooder, 120)
    quiet = make_run(created_by=boss, goal="asks once")
    (theirs,) = pending_rows(quiet, 1)
    web = client_for(boss)
    page = web.get("/approvals/").content.decode()
    assert f'id="approval-{theirs.pk}"' in page  # the later run's one call is on the first page
    assert page.count('class="approval a-pending"') == inbox.CARDS_PER_RUN + 1
    assert f"{120 - inbox.CARDS_PER_RUN} more waiting in run {flooder.pk}" in page
    assert len(page) < 200_000
    assert 'id="approval-count"' in page and ">121</span>" in page  # the header counts them all
    one_run = web.get(f"/approvals/?run={flooder.pk}").content.decode()
    assert one_run.count('class="approval a-pending"') == inbox.CARDS_PER_RUN_PAGE
    last = web.get(f"/approvals/?run={flooder.pk}&page=3").content.decode()
    assert last.count('class="approval a-pending"') == 120 - 2 * inbox.CARDS_PER_RUN_PAGE
    for bad in ("?page=abc", "?page=-1", "?page=99999999999999999999", "?run=x", "?run=0"):
        assert web.get(f"/approvals/{bad}").status_code == 200, bad


def test_the_inbox_pages_its_runs(boss):
    from dashboard import inbox

    runs = [make_run(created_by=boss, goal=f"run {i}") for i in range(inbox.RUNS_PER_PAGE + 3)]
    for run in runs:
        pending_rows(run, 1)
    web = client_for(boss)
    first = web.get("/approvals/").content.decode()
    second = web.get("/approvals/?page=2").content.decode()
    assert first.count('class="approval-run"') == inbox.RUNS_PER_PAGE
    assert second.count('class="approval-run"') == 3
    assert f'id="approval-run-{runs[0].pk}"' in first  # the run waiting longest first
    assert f'id="approval-run-{runs[-1].pk}"' in second


def test_a_policy_change_is_recorded_as_the_rule_added_and_a_full_policy_never_fails_a_decision(
    boss,
):
    full = [
        {"tool": "network", "action": "deny", "pattern": f"^h{i}\\.example:"} for i in range(500)
    ]
    run = waiting(created_by=boss, tool_policy=full[:499])
    hosts = pending_rows(run, 3, tool="network")
    web = client_for(boss)
    # Denying a host adds a rule: the event holds that rule, not the whole policy again.
    r = web.post(f"/approvals/{hosts[0].pk}/decide", {"decision": "deny", "comment": "no"})
    assert r.status_code == 302
    change = Event.objects.filter(run=run, kind="run.updated").latest("seq")
    assert set(change.payload) == {"rule_added", "rules", "because"}
    assert change.payload["rules"] == 500 and len(json.dumps(change.payload)) < 1_000
    # The policy is full: the next denial still stands (the host is not remembered), no 500.
    r = web.post(
        f"/approvals/{hosts[1].pk}/decide",
        {"decision": "deny", "comment": "no"},
        HTTP_HX_REQUEST="true",
    )
    assert r.status_code == 200 and Approval.objects.get(pk=hosts[1].pk).status == "denied"
    # "Allow for this run" on a full policy: refused with the reason, nothing decided.
    r = web.post(
        f"/approvals/{hosts[2].pk}/decide", {"decision": "approve-for-run"}, HTTP_HX_REQUEST="true"
    )
    assert r.status_code == 200 and "tool policy is full" in r.content.decode()
    assert Approval.objects.get(pk=hosts[2].pk).status == "pending"
    _, token = ApiToken.issue(boss, ["read", "decide"])
    from django.test import Client

    r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        f"/api/v1/approvals/{hosts[2].pk}/decision",
        json.dumps({"decision": "approve", "allow_similar": True}),
        content_type="application/json",
    )
    assert r.status_code == 422 and "tool policy is full" in r.json()["detail"]


# --- 12: patterns that would hang a worker ----------------------------------------------------
EVIL = "(a+)+$"  # exponential on `re` against many a's and a b
BAIT = "a" * 40 + "b"


@pytest.mark.timeout(60)
def test_a_catastrophic_policy_pattern_decides_at_once_on_the_agents_text(boss):
    from agents import policy

    rules = policy.validate(
        [
            {"tool": "bash", "action": "deny", "pattern": EVIL},
            {"tool": "network", "action": "deny", "pattern": EVIL},
            {"tool": "bash", "action": "allow", "pattern": "(x+x+)+y"},
        ]
    )
    assert policy.decide(rules, "bash", {"command": f"echo {BAIT * 1000}"}).action != "deny"
    assert policy.decide(rules, "bash", {"command": f"echo {'x' * 5000}"}).action == "allow"
    assert policy.decide_network(rules, BAIT * 100, 443).action == "ask"
    # And in a real run: the agent's command against the run's policy, in the worker.
    run = drive_until_idle(
        make_run(
            created_by=boss,
            tool_policy=[{"tool": "bash", "action": "deny", "pattern": EVIL}],
            turns=[{"tool_calls": [call("bash", command=f"echo {BAIT}")]}, finish_turn()],
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason


@pytest.mark.timeout(60)
def test_a_catastrophic_script_branch_pattern_is_decided_at_once():
    from agents.providers.script_branches import Seen, holds

    assert holds({"note": EVIL}, Seen(notes=[BAIT * 100])) is None
    assert holds({"note": "(?i)A+$"}, Seen(notes=["aaa"])) == {"note": "aaa"}


@pytest.mark.parametrize(
    "pattern", [r"(a)\1", r"^(?=.*rm)", r"(?<!x)rm", r"(?!curl)", "(a{500}){500}"]
)
def test_patterns_that_cannot_run_in_linear_time_are_refused_when_saved(boss, pattern):
    rules = [{"tool": "bash", "action": "deny", "pattern": pattern}]
    with pytest.raises(services.RunError, match="RE2"):
        make_run(created_by=boss, tool_policy=rules)
    run = make_run(created_by=boss)
    with pytest.raises(services.RunError, match="not a valid regular expression"):
        services.set_policy(run.pk, rules, actor="user:bea")
    _, token = ApiToken.issue(boss, ["read", "write"])
    from django.test import Client

    r = Client(HTTP_AUTHORIZATION=f"Bearer {token}").post(
        "/api/v1/runs",
        json.dumps({"goal": "g", "checks": ["true"], "tool_policy": rules}),
        content_type="application/json",
    )
    assert r.status_code == 422 and "RE2" in r.content.decode(), r.content


def test_a_stored_pattern_re2_refuses_errs_towards_a_person(boss):
    """A policy saved before the check: its deny rule still denies, its allow rule allows
    nothing."""
    from agents import policy

    deny = [{"tool": "bash", "action": "deny", "pattern": r"(?=rm)"}]
    allow = [{"tool": "bash", "action": "allow", "pattern": r"^(?=.*)rm"}]
    assert policy.decide(deny, "bash", {"command": "ls"}).action == "deny"
    assert policy.decide(allow, "bash", {"command": "rm -rf /"}).action == "ask"
    network_deny = [{**deny[0], "tool": "network"}]
    assert policy.decide_network(network_deny, "x.org", 443).action == "deny"


# --- 7: ask less, where it is safe --------------------------------------------------------------
def needs_sandbox() -> None:
    from agents.sandbox import isolation_available

    if isolation_available() != "bwrap":
        pytest.skip("bubblewrap is not usable here")


OPAQUE_CALLS = [
    "python3 -c 'import json; print(json.dumps([1]))'",
    "node -e 'console.log(1)' || true",
    "sh -c 'echo made > made.txt'",
    "python3 - <<'PY'\nprint('from stdin')\nPY",
]


def opaque_run(**kwargs) -> Run:
    turns = [{"tool_calls": [call("bash", command=c)]} for c in OPAQUE_CALLS]
    return make_run(turns=[*turns, finish_turn()], checks=["test -f made.txt"], **kwargs)


def test_in_the_sandbox_code_the_classifier_cannot_read_runs_without_asking(boss):
    needs_sandbox()
    run = drive_until_idle(opaque_run(created_by=boss))
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert not run.approvals.exists()
    assert (run.workspace_path / "made.txt").read_text() == "made\n"


def test_without_the_sandbox_or_when_the_operator_says_so_opaque_code_still_asks(boss, settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ISOLATION": "subprocess", "ALLOW_UNISOLATED": True}
    run = drive_until_idle(opaque_run(created_by=boss))
    assert run.status == RunStatus.AWAITING_APPROVAL
    assert (
        "python3 -c runs code given as text"
        in Event.objects.get(run=run, kind="approval.requested").payload["reason"]
    )
    needs_sandbox()
    settings.SHIFTLOG = {
        **settings.SHIFTLOG,
        "ISOLATION": "",
        "ALLOW_UNISOLATED": False,
        "ASK_OPAQUE_IN_SANDBOX": True,
    }
    assert drive_until_idle(opaque_run(created_by=boss)).status == RunStatus.AWAITING_APPROVAL


@pytest.mark.parametrize(
    "command, why",
    [
        ("python3 -c 'print(1)'; rm -rf /etc", "deletes widely"),
        ("sh -c 'true' && cp made.txt /usr/local/bin/x", "writes outside the workspace"),
        ("node -e '1' ; curl -s https://example.org", "reaches the network"),
        ("sudo python3 -c 'print(1)'", "changes permissions or the system"),
    ],
)
def test_in_the_sandbox_what_the_classifier_reads_as_risky_still_asks(boss, command, why):
    needs_sandbox()
    run = drive_until_idle(
        make_run(created_by=boss, turns=[{"tool_calls": [call("bash", command=command)]}])
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    asked = Event.objects.get(run=run, kind="approval.requested").payload["reason"]
    assert why in asked


def test_in_the_sandbox_opaque_code_reaching_a_new_host_is_asked_at_the_proxy(boss, settings):
    needs_sandbox()
    settings.SHIFTLOG = {**settings.SHIFTLOG, "EGRESS_ALLOW_PRIVATE": True}
    reach = (
        "python3 -c \"import urllib.request as u\ntry: u.urlopen('http://127.0.0.2:9/', "
        'timeout=5)\nexcept Exception as e: print(e)"'
    )
    run = drive_until_idle(
        make_run(created_by=boss, turns=[{"tool_calls": [call("bash", command=reach)]}])
    )
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    (asked,) = run.approvals.all()
    assert (asked.tool_name, asked.tool_input) == ("network", {"host": "127.0.0.2", "port": 9})


def test_an_external_agents_opaque_code_still_asks(boss):
    """An external agent runs its commands on its own machine, outside our sandbox."""
    from django.test import Client

    _, token = ApiToken.issue(boss, ["read", "write"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    created = api.post(
        "/api/v1/runs",
        json.dumps({"goal": "g", "checks": ["true"], "provider": "external"}),
        content_type="application/json",
    )
    assert created.status_code == 201, created.content
    r = api.post(
        f"/api/v1/runs/{created.json()['id']}/tool-calls",
        json.dumps({"tool": "Bash", "input": {"command": "python -c 'import freezegun'"}}),
        content_type="application/json",
    )
    assert r.json()["decision"] == "ask", r.content


@pytest.mark.parametrize(
    "command",
    [
        "python -X importtime -c 'import os'",
        "python3 -W ignore -c 'print(1)'",
        "node -r ./setup.js -e 'process.exit(0)'",
        "ruby -r json -e 'puts 1'",
    ],
)
def test_without_the_sandbox_an_option_value_does_not_hide_code_given_as_text(command):
    """`python -X importtime -c CODE` was read as running a script named "importtime"."""
    from agents import policy

    decision = policy.decide([], "bash", {"command": command})
    assert decision.action == "ask" and "runs code given as text" in decision.reason
    assert policy.decide([], "bash", {"command": command}, sandboxed=True).action == "allow"


def test_an_external_agent_asking_past_the_runs_cap_is_denied_and_the_run_pauses(boss, caps):
    from django.test import Client

    caps(per_run=1)
    _, token = ApiToken.issue(boss, ["read", "write"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    run_id = api.post(
        "/api/v1/runs",
        json.dumps({"goal": "g", "checks": ["true"], "provider": "external"}),
        content_type="application/json",
    ).json()["id"]

    def propose(command: str) -> dict:
        return api.post(
            f"/api/v1/runs/{run_id}/tool-calls",
            json.dumps({"tool": "Bash", "input": {"command": command}}),
            content_type="application/json",
        ).json()

    first = propose("rm -rf build")
    assert first["decision"] == "ask"
    approvals.decide(first["approval"], user=boss, approve=True)
    second = propose("rm -rf dist")
    assert second["decision"] == "deny" and "at most 1" in second["reason"], second
    run = Run.objects.get(pk=run_id)
    assert run.status == RunStatus.PAUSED and "at most 1" in run.status_reason
    assert run.approvals.count() == 1


def test_the_cli_says_what_a_decision_left_the_run_doing(boss):
    from io import StringIO

    run = waiting(created_by=boss)
    services.pause_run(run.pk, actor="user:bea")
    out = StringIO()
    call_command("approve", str(run.approvals.get().pk), "--user", "bea", stdout=out)
    assert f"run {run.pk} is paused: resume it to go on" in out.getvalue()
    other = waiting(created_by=boss)
    out = StringIO()
    call_command(
        "deny", str(other.approvals.get().pk), "--user", "bea", "--reason", "no", stdout=out
    )
    assert f"run {other.pk} continues" in out.getvalue()
