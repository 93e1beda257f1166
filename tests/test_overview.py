"""The Overview's figures, exact on hand-made runs: counts, stuck detection at its boundary, spend
today and this week, burn rates and the forecasts to each cap; the page, its filters and the CLI."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import call_command
from django.db.models import F
from django.test import override_settings

from agents import overview, services
from agents.models import Approval, Event, EventKind, Run, RunStatus
from tests.helpers import client_for, make_run

pytestmark = pytest.mark.django_db

# A Wednesday: the week began on Monday the 7th at midnight.
NOW = datetime(2026, 12, 9, 15, 0, tzinfo=UTC)


def event(run: Run, kind: str, at: datetime, **payload) -> Event:
    run.refresh_from_db()
    seq = run.last_seq + 1
    Run.objects.filter(pk=run.pk).update(last_seq=F("last_seq") + 1)
    return Event.objects.create(run=run, seq=seq, kind=kind, payload=payload, created_at=at)


def turn(run: Run, at: datetime, *, tokens: int = 0, cost: str = "0") -> Event:
    usage = {
        "input_tokens": tokens // 2,
        "output_tokens": tokens - tokens // 2,
        "cache_read_input_tokens": 0,
        "cache_creation_input_tokens": 0,
    }
    return event(run, EventKind.MODEL_TURN, at, usage=usage, cost_usd=cost)


def hand_made(status: str = RunStatus.RUNNING, *, at: datetime = NOW, **fields) -> Run:
    """A run in `status` whose only event is at `at` (no worker drives it)."""
    run = Run.objects.create(goal="hand made", model="scripted", status=status, **fields)
    event(run, EventKind.RUN_CREATED, at)
    run.refresh_from_db()
    return run


def compute(**kw) -> overview.Overview:
    return overview.compute(Run.objects.all(), Approval.objects.pending(), now=kw.pop("now", NOW))


# --- counts ----------------------------------------------------------------------------------
def test_counts_are_by_status_with_every_status_listed():
    for status in (RunStatus.RUNNING, RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.SUCCEEDED):
        hand_made(status)
    o = compute()
    counts = {s: n for s, _, n in o.counts}
    assert counts == {
        "queued": 0,
        "running": 2,
        "awaiting_approval": 0,
        "paused": 1,
        "verifying": 0,
        "waiting_for_children": 0,
        "succeeded": 1,
        "failed": 0,
        "cancelled": 0,
    }
    assert o.total == 4


def test_waiting_approvals_are_listed_oldest_first_with_their_age():
    run = hand_made(RunStatus.AWAITING_APPROVAL)
    young = Approval.objects.create(run=run, tool_use_id="b", tool_name="bash")
    old = Approval.objects.create(run=run, tool_use_id="a", tool_name="bash")
    Approval.objects.filter(pk=young.pk).update(created_at=NOW - timedelta(minutes=5))
    Approval.objects.filter(pk=old.pk).update(created_at=NOW - timedelta(hours=2, minutes=10))
    Approval.objects.create(run=run, tool_use_id="c", tool_name="bash", status="approved")
    o = compute()
    assert o.approvals_waiting == 2
    assert [w.approval.pk for w in o.approvals] == [old.pk, young.pk]
    assert [w.age_seconds for w in o.approvals] == [7800.0, 300.0]
    assert [w.age for w in o.approvals] == ["2 h 10 min", "5 min"]


# --- stuck -----------------------------------------------------------------------------------
def test_a_run_is_stuck_only_after_more_than_the_threshold_without_an_event():
    at = NOW - timedelta(minutes=10)
    exactly = hand_made(RunStatus.RUNNING, at=at)
    just_over = hand_made(RunStatus.VERIFYING, at=at - timedelta(microseconds=1))
    paused_long_ago = hand_made(RunStatus.PAUSED, at=NOW - timedelta(days=1))
    o = compute()
    assert [s.run.pk for s in o.stuck] == [just_over.pk] and o.stuck_count == 1
    assert o.stuck_minutes == 10
    ids = set(overview.stuck(Run.objects.all(), NOW).values_list("pk", flat=True))
    assert ids == {just_over.pk}
    assert exactly.pk not in ids and paused_long_ago.pk not in ids
    # A newer event takes it off the list.
    event(just_over, EventKind.HARNESS_MESSAGE, NOW - timedelta(minutes=1))
    assert compute().stuck_count == 0


@override_settings(SHIFTLOG={**settings.SHIFTLOG, "STUCK_MINUTES": 2})
def test_the_stuck_threshold_comes_from_the_settings():
    run = hand_made(RunStatus.RUNNING, at=NOW - timedelta(minutes=3))
    o = compute()
    assert o.stuck_minutes == 2 and [s.run.pk for s in o.stuck] == [run.pk]
    assert o.stuck[0].quiet_seconds == 180.0


# --- spend -----------------------------------------------------------------------------------
def test_spend_today_and_this_week_count_turns_and_verdicts_by_their_time():
    run = hand_made(RunStatus.SUCCEEDED)
    turn(run, NOW - timedelta(hours=1), tokens=100, cost="0.250000")  # today
    turn(run, NOW.replace(hour=0, minute=0), tokens=10, cost="0.010000")  # today, at midnight
    turn(run, NOW - timedelta(days=1), tokens=1000, cost="1.000000")  # Tuesday: this week
    turn(run, NOW - timedelta(days=2, hours=15), tokens=5, cost="0.005000")  # Monday 00:00
    turn(run, NOW - timedelta(days=2, hours=15, seconds=1), tokens=7, cost="7")  # last week
    event(run, EventKind.JUDGE_VERDICT, NOW - timedelta(minutes=3), cost_usd="0.100000")
    o = compute()
    assert o.today_start == datetime(2026, 12, 9, tzinfo=UTC)
    assert o.week_start == datetime(2026, 12, 7, tzinfo=UTC)
    assert o.spend["today"] == {"usd": Decimal("0.360000"), "tokens": 110}
    assert o.spend["week"] == {"usd": Decimal("1.365000"), "tokens": 1115}


def test_spend_counts_only_the_runs_given():
    mine, theirs = hand_made(RunStatus.RUNNING), hand_made(RunStatus.RUNNING)
    turn(mine, NOW, tokens=10, cost="1")
    turn(theirs, NOW, tokens=20, cost="2")
    o = overview.compute(Run.objects.filter(pk=mine.pk), Approval.objects.none(), now=NOW)
    assert o.spend["today"] == {"usd": Decimal("1.000000"), "tokens": 10}
    assert o.total == 1


# --- burn and forecasts ----------------------------------------------------------------------
def test_burn_rate_is_over_the_last_ten_minutes_and_forecasts_each_cap():
    run = hand_made(
        RunStatus.RUNNING,
        at=NOW - timedelta(hours=1),
        started_at=NOW - timedelta(hours=1),
        max_tokens=100_000,
        max_cost_usd=Decimal("10"),
        max_wall_seconds=7200,
        input_tokens=30_000,
        output_tokens=10_000,
        cost_usd=Decimal("4"),
        active_seconds=3000.0,
    )
    turn(run, NOW - timedelta(minutes=20), tokens=99_999, cost="9")  # before the window
    turn(run, NOW - timedelta(minutes=9), tokens=3000, cost="0.5")
    turn(run, NOW - timedelta(minutes=1), tokens=2000, cost="0.5")
    [b] = compute().burns
    assert b.window_seconds == 600 and b.tokens == 5000 and b.cost_usd == Decimal("1.000000")
    assert b.tokens_per_minute == 500.0 and b.usd_per_hour == Decimal("6.000000")
    tokens, dollars, wall = b.forecasts
    # 60,000 tokens left at 500 a minute: 120 minutes; $6 left at $6 an hour; 4,200 s left.
    assert (tokens.state, tokens.seconds, str(tokens)) == ("eta", 7200.0, "tokens cap in ~2 h")
    assert (dollars.seconds, str(dollars)) == (3600.0, "dollars cap in ~1 h")
    assert (wall.seconds, str(wall)) == (4200.0, "wall time cap in ~1 h 10 min")


def test_a_young_run_burns_over_its_own_age():
    run = hand_made(RunStatus.RUNNING, started_at=NOW - timedelta(minutes=2), max_tokens=2600)
    turn(run, NOW - timedelta(minutes=1), tokens=1000)
    [b] = compute().burns
    assert b.window_seconds == 120 and b.tokens_per_minute == 500.0
    assert str(b.forecasts[0]) == "tokens cap in ~5 min"  # 2,600 left: 5.2 minutes


def test_forecasts_say_no_cap_cap_reached_and_not_burning():
    no_caps = hand_made(RunStatus.RUNNING, started_at=NOW - timedelta(hours=1))
    turn(no_caps, NOW, tokens=10, cost="1")
    reached = hand_made(
        RunStatus.VERIFYING,
        started_at=NOW - timedelta(hours=1),
        max_tokens=10,
        input_tokens=10,
        max_cost_usd=Decimal("1"),
        cost_usd=Decimal("2"),
        max_wall_seconds=60,
        active_seconds=61.0,
    )
    idle = hand_made(
        RunStatus.RUNNING,
        started_at=NOW - timedelta(hours=1),
        max_tokens=10,
        max_cost_usd=Decimal("1"),
    )
    hand_made(RunStatus.PAUSED, max_tokens=10)  # not active: no burn listed
    burns = {b.run.pk: [str(f) for f in b.forecasts] for b in compute().burns}
    assert burns == {
        no_caps.pk: ["tokens: no cap", "dollars: no cap", "wall time: no cap"],
        reached.pk: ["tokens: cap reached", "dollars: cap reached", "wall time: cap reached"],
        idle.pk: ["tokens: not burning", "dollars: not burning", "wall time: no cap"],
    }


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "< 1 min"), (59, "< 1 min"), (60, "~1 min"), (7800, "~2 h 10 min"), (3 * 86400, "~3 d")],
)
def test_durations_read_plainly(seconds, text):
    assert overview.duration(seconds) == text


# --- the page, the filters and the CLI ---------------------------------------------------------
def test_the_overview_counts_only_what_the_user_may_see_and_links_every_figure(owner, outsider):
    make_run(goal="mine", created_by=owner)
    make_run(goal="not theirs", created_by=outsider)
    html = client_for(owner).get("/overview/").content.decode()
    assert 'href="/?status=queued"' in html and 'id="count-queued"' in html
    queued = html.split('id="count-queued"')[1].split("</a>")[0]
    assert ">1<" in queued.replace(" ", "")
    for link in ('href="/?stuck=1"', 'href="/?approvals=waiting"', 'href="/?since=today"'):
        assert link in html
    assert "UTC" in html


def test_the_overview_needs_a_login(client):
    response = client.get("/overview/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_an_htmx_poll_gets_only_the_figures(owner):
    response = client_for(owner).get("/overview/", HTTP_HX_REQUEST="true")
    html = response.content.decode()
    assert html.lstrip().startswith('<div id="figures"') and "<html" not in html


def test_the_overview_costs_the_same_queries_for_many_runs(
    owner, supervisor, django_assert_max_num_queries
):
    c = client_for(supervisor)
    hand_made(RunStatus.RUNNING, at=NOW - timedelta(hours=1))
    with django_assert_max_num_queries(20) as few:
        assert c.get("/overview/").status_code == 200
    for i in range(15):
        run = hand_made([RunStatus.RUNNING, RunStatus.AWAITING_APPROVAL, RunStatus.PAUSED][i % 3])
        turn(run, NOW, tokens=10, cost="0.1")
        if run.status == RunStatus.AWAITING_APPROVAL:
            Approval.objects.create(run=run, tool_use_id="x", tool_name="bash")
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert c.get("/overview/").status_code == 200
    print("queries per overview page:", len(few.captured_queries))


def test_the_runs_list_filters_by_stuck_waiting_approvals_and_spend(owner):
    now = datetime.now(UTC)
    stuck = hand_made(RunStatus.RUNNING, at=now - timedelta(hours=1), created_by=owner)
    busy = hand_made(RunStatus.RUNNING, at=now, created_by=owner)
    waiting = hand_made(RunStatus.AWAITING_APPROVAL, at=now, created_by=owner)
    Approval.objects.create(run=waiting, tool_use_id="x", tool_name="bash")
    turn(busy, now, tokens=5, cost="0.1")
    turn(stuck, now - timedelta(days=8), tokens=5, cost="0.1")
    c = client_for(owner)

    def shown(url: str) -> set[int]:
        html = c.get(url).content.decode()
        return {r.pk for r in (stuck, busy, waiting) if f'id="run-{r.pk}"' in html}

    assert shown("/?stuck=1") == {stuck.pk}
    assert shown("/?approvals=waiting") == {waiting.pk}
    assert shown("/?since=today") == {busy.pk}
    assert shown("/?status=running&since=week") == {busy.pk}
    assert shown("/") == {stuck.pk, busy.pk, waiting.pk}


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("status=bogus", "status"),
        ("stuck=yes", "stuck"),
        ("approvals=all", "approvals"),
        ("since=yesterday", "since"),
    ],
)
def test_a_bad_filter_is_a_clear_message_not_a_crash(owner, query, message):
    response = client_for(owner).get(f"/?{query}")
    assert response.status_code == 400
    html = response.content.decode()
    assert 'class="error"' in html and message in html


def test_the_cli_prints_the_same_figures(owner):
    run = services.create_demo_run(created_by=owner)
    out = StringIO()
    call_command("overview", stdout=out)
    text = out.getvalue()
    assert "queued: 1" in text and "spent today: $0.000000" in text and "stuck" in text
    out = StringIO()
    call_command("overview", "--json", stdout=out)
    data = json.loads(out.getvalue())
    assert data["counts"]["queued"] == 1 and data["runs"] == 1
    assert data["spend"]["today"]["usd"] == "0.000000" and data["timezone"] == "UTC"
    assert run.pk
