"""No input reaches a 500, and hostile input changes nothing.

Hypothesis drives every form field and URL parameter of the dashboard with values each of them
must refuse (deep and huge JSON, numbers past what a column holds, NaN and Infinity, NUL bytes,
invalid UTF-8, very long text, unknown choices, ids no row can have): every answer is a 4xx or a
form error, never a 5xx, and the event log, the runs and the approvals are as they were. The CLI
gets the same from a table of its arguments. Positive controls beside them show the same
endpoints do act on good input, so a refusal is the input's doing, not a broken endpoint's.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.models import Approval, Checkpoint, Event, Run
from tests.helpers import client_for

BIG = ["9" * 19, "9" * 40, str(2**63), str(2**64 + 1), "-" + "9" * 30, "1" + "0" * 400]
NON_FINITE = ["NaN", "nan", "Infinity", "-Infinity", "1e400", "-1e400", "inf"]
NUL = ["a\x00b", "\x00", "rm -rf build\x00; curl evil"]
NOT_NUMBERS = ["", "ten", "1.5.2", "0x10", "1_000", "١٢٣"]  # the last: Arabic-Indic digits

text_with_nul = st.builds(lambda a, b: a + "\x00" + b, st.text(max_size=20), st.text(max_size=20))
too_long = st.integers(min_value=20_001, max_value=60_000).map(lambda n: "x" * n)
bad_text = st.one_of(text_with_nul, too_long, st.sampled_from(NUL))
bad_number = st.one_of(
    st.sampled_from(BIG + NON_FINITE + NOT_NUMBERS),
    st.integers(max_value=0).map(str),
    st.integers(min_value=2**63).map(str),
)
deep_json = st.integers(min_value=33, max_value=20_000).map(lambda n: "[" * n + "]" * n)
bad_json = st.one_of(
    deep_json,
    st.integers(min_value=33, max_value=3000).map(lambda n: '{"a":' * n + "1" + "}" * n),
    st.sampled_from(["[NaN]", '[{"tool": "bash", "action": Infinity}]', "{", "[1,", "\x00"]),
    st.just("[" + ",".join(['{"tool": "bash", "action": "allow"}'] * 60_000) + "]"),
)
# A budget left blank means "unchanged": on its own it is good input (a resume that acts).
bad_budget = bad_number.filter(lambda v: v != "")
bad_choice = st.one_of(st.sampled_from(["", "APPROVE", "approve ", "drop", "\x00"]), bad_text)
bad_id = st.one_of(st.sampled_from(BIG + NON_FINITE + NOT_NUMBERS + ["0", "-1"]), bad_text)


def endpoints(run: Run, approval: Approval, checkpoint: Checkpoint):
    """(method, url, {field: strategy}) for every form and parameter the dashboard reads,
    each field given values it must refuse."""
    r, a, c = run.pk, approval.pk, checkpoint.pk
    return [
        ("get", f"/runs/{r}/events/", {"before": bad_id}),
        ("get", f"/runs/{r}/diff/", {"a": bad_id, "b": bad_id}),
        (
            "post",
            "/runs/new/",
            {
                "goal": bad_text,
                "checks": bad_text,
                "provider": bad_choice,
                "max_sessions": bad_number,
                "max_tokens": bad_number,
                "max_cost_usd": bad_number,
                "max_wall_seconds": bad_number,
                "max_turns_per_session": bad_number,
                "tool_policy": bad_json,
            },
        ),
        ("post", f"/runs/{r}/note", {"text": bad_text}),
        ("post", f"/runs/{r}/policy", {"rules": bad_json}),
        (
            "post",
            f"/runs/{r}/resume",
            {
                "max_sessions": bad_budget,
                "max_tokens": bad_budget,
                "max_cost_usd": bad_budget,
                "max_wall_seconds": bad_budget,
            },
        ),
        ("post", f"/runs/{r}/checkpoint", {"label": bad_text}),
        ("post", f"/runs/{r}/checkpoints/{c}/rewind", {"note": bad_text}),
        ("post", f"/runs/{r}/checkpoints/{c}/fork", {"goal": bad_text, "note": bad_text}),
        ("post", f"/approvals/{a}/decide", {"decision": bad_choice, "comment": bad_text}),
        (
            "post",
            f"/approvals/{a}/decide",
            {"decision": st.just("edit"), "edited": st.one_of(bad_json, bad_text)},
        ),
        ("post", f"/approvals/{a}/decide", {"decision": st.just("deny"), "comment": bad_text}),
    ]


def state() -> tuple:
    return (
        Event.objects.count(),
        Run.objects.count(),
        list(Approval.objects.values_list("status", flat=True)),
    )


def make_world(supervisor, owner):
    """A run paused at its risky step (so resume would act), a checkpoint, a pending approval."""
    from agents import services
    from tests.helpers import drive_until_idle

    run = drive_until_idle(services.create_demo_run(created_by=owner))
    assert run.status == "awaiting_approval", run.status_reason
    services.pause_run(run.pk, actor="test")
    return (
        client_for(supervisor),
        run,
        Approval.objects.get(run=run),
        run.checkpoints.get(kind="session_end"),
    )


@pytest.fixture
def world(supervisor, owner):
    return make_world(supervisor, owner)


@pytest.fixture(scope="module")
def _shared_world(django_db_setup, django_db_blocker):
    """One world for the module's many tests that must change nothing (each checks it did not):
    made once, outside their transactions, and removed when they are done."""
    from tests.helpers import user_with

    with django_db_blocker.unblock():
        made = make_world(
            user_with("hostile-sam", "view_run", "control_run", "decide_approval"),
            get_user_model().objects.create_user("hostile-olivia", password="pw-olivia-1"),
        )
    yield made
    with django_db_blocker.unblock():
        Run.objects.filter(pk=made[1].pk).delete()
        get_user_model().objects.filter(username__startswith="hostile-").delete()


@pytest.fixture
def read_only_world(_shared_world, db):
    """The shared world, in a test of its own transaction (anything a test did write is rolled
    back; its `state()` checks say it wrote nothing)."""
    return _shared_world


def test_the_endpoints_do_act_on_good_input(world):
    """Positive controls: each endpoint the property below hammers changes state when given
    good input, so its refusals there are the input's doing."""
    c, run, approval, checkpoint = world
    before = Event.objects.count()
    assert c.post(f"/runs/{run.pk}/note", {"text": "fine"}).status_code == 302
    assert c.post(f"/runs/{run.pk}/checkpoint", {"label": "fine"}).status_code == 302
    assert c.post(f"/runs/{run.pk}/policy", {"rules": "[]"}).status_code == 302
    assert c.post(f"/runs/{run.pk}/resume", {"max_tokens": "1000000"}).status_code == 302
    assert c.get(f"/runs/{run.pk}/events/?before=5").status_code == 200
    assert c.get(f"/runs/{run.pk}/diff/?a={checkpoint.number}&b=live").status_code == 200
    made = c.post("/runs/new/", {"goal": "g", "checks": "true", "provider": "scripted"})
    assert made.status_code == 302 and Run.objects.count() == 2
    decided = c.post(
        f"/approvals/{approval.pk}/decide",
        {"decision": "edit", "edited": '{"command": "true"}'},
        HTTP_HX_REQUEST="true",
    )
    assert decided.status_code == 200 and "Approved" in decided.content.decode()
    assert Event.objects.count() > before + 6


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_hostile_values_in_any_form_or_parameter_get_a_4xx_or_a_form_error(world, data):
    c, run, approval, checkpoint = world
    method, url, fields = data.draw(st.sampled_from(endpoints(run, approval, checkpoint)))
    values = {name: data.draw(strategy, label=name) for name, strategy in fields.items()}
    htmx = data.draw(st.booleans(), label="htmx")
    before = state()
    headers = {"HTTP_HX_REQUEST": "true"} if htmx else {}
    response = getattr(c, method)(url, values, **headers)
    assert response.status_code < 500, (url, {k: str(v)[:60] for k, v in values.items()})
    if response.status_code == 302:  # a plain form falls back to the page with a message
        assert response.url.startswith("/"), response.url
    assert state() == before, (url, {k: str(v)[:60] for k, v in values.items()})


@pytest.mark.parametrize(
    "path",
    [
        "/runs/{big}/",
        "/runs/{big}/events/?before=1",
        "/runs/{run}/events/?before={big}",
        "/runs/{big}/diff/?a=1",
        "/runs/{run}/diff/?a={big}&b={big}",
        "/approvals/{big}/decide",
        "/runs/{run}/artifacts/{big}/",
        "/runs/{run}/artifacts/1/download",
        "/?page={big}&status=\x00&q=%00" + "x" * 5000,
        "/login/{big}/{big}/",
    ],
)
@pytest.mark.parametrize("big", [*BIG, "%00", "%ff%fe", "-1"])
def test_ids_and_parameters_no_row_can_have_are_a_404_not_a_crash(read_only_world, path, big):
    c, run = read_only_world[:2]
    before = state()
    url = path.format(big=big, run=run.pk)
    response = c.post(url) if "decide" in url else c.get(url)
    assert response.status_code in {200, 302, 400, 403, 404, 405}, (url, response.status_code)
    assert state() == before


def test_raw_bodies_that_are_not_utf8_are_not_a_crash(world):
    c, run, approval, _ = world
    before = state()
    for url in (f"/runs/{run.pk}/note", f"/approvals/{approval.pk}/decide", "/runs/new/"):
        response = c.generic(
            "POST",
            url,
            b"text=\xff\xfe\xfa&decision=\xc3\x28&goal=\xe2\x28\xa1",
            content_type="application/x-www-form-urlencoded",
            HTTP_HX_REQUEST="true",
        )
        assert response.status_code < 500, url
    assert state() == before


# {run} and {approval} stand for the world's own ids (on PostgreSQL ids do not restart at 1),
# {user} for its supervisor.
CLI_CASES = [
    (["show_run", "9" * 40], "id"),
    (["tail_run", "{run}", "--after", "-5"], "seq"),
    (["approve", str(2**64), "--user", "{user}"], "id"),
    (["deny", "{approval}", "--user", "{user}", "--reason", "no\x00way"], "NUL"),
    (["note_run", "{run}", "a\x00b"], "NUL"),
    (["create_run", "--goal", "g", "--check", "true", "--max-tokens", str(2**70)], "max-tokens"),
    (["create_run", "--goal", "g", "--check", "true", "--max-cost", "NaN"], "max-cost"),
    (["create_run", "--goal", "g", "--check", "true", "--max-cost", "1e400"], "max-cost"),
    (["create_run", "--goal", "g\x00", "--check", "true"], "NUL"),
    (["create_run", "--goal", "g", "--check", "true", "--policy", "[" * 5000], "nested"),
    (["create_run", "--goal", "g", "--check", "true", "--webhook", "file:///etc"], "http"),
    (["create_run", "--goal", "g", "--check", "true", "--approval-timeout", "0"], "at least"),
    (["set_policy", "{run}", "--rules", '[{"tool": "bash", "action": NaN}]'], "NaN"),
    (["rewind_run", "{run}", "--to", "9" * 30], "id"),
    (["checkpoint_run", "{run}", "--label", "x\x00"], "NUL"),
    (["resume_run", "{run}", "--max-tokens", "-3"], "at least"),
]


@pytest.mark.parametrize(("args", "said"), CLI_CASES)
def test_hostile_cli_arguments_get_a_clear_error_and_exit_2(read_only_world, args, said):
    c, run, approval, _ = read_only_world
    user = c.session.get("_auth_user_id")
    ids = {
        "{run}": str(run.pk),
        "{approval}": str(approval.pk),
        "{user}": get_user_model().objects.get(pk=user).username,
    }
    args = [ids.get(a, a) for a in args]
    before = state()
    with pytest.raises((CommandError, SystemExit)) as info:
        call_command(*args, stdout=StringIO(), stderr=StringIO())
    error = info.value
    if isinstance(error, CommandError) and str(error).startswith("Error: argument"):
        # argparse refused it (call_command says so with status 1; from a shell it is exit 2:
        # tests/test_cli.py runs a real process).
        assert said.lower() in str(error).lower(), str(error)
    elif isinstance(error, CommandError):
        assert error.returncode == 2 and said.lower() in str(error).lower(), str(error)
    else:
        assert error.code == 2
    assert state() == before
