"""A run's own Slack settings (Run.slack_channel, Run.slack_news): they win over its project's,
what a run leaves unset is its project's, "off" silences its news; set at creation (RunSpec) and
changed later from the run page, the API and `manage.py reach --run`. Posted to the fake Slack
Web API over real HTTP (tests/fake_slack.py)."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from agents.models import Event, ProjectReach, Run, SlackMessage
from api.models import ApiToken
from tests.helpers import client_for, drain, drive_until_idle, finish_turn, make_run, user_with
from tests.test_slack import asking_run

pytestmark = pytest.mark.django_db


def ended(capture, **kwargs) -> Run:
    with capture(execute=True):
        return drive_until_idle(make_run(turns=[finish_turn()], **kwargs))


def posted(slack) -> list[tuple[str, str]]:
    drain()
    return [(p["channel"], p["text"]) for p in slack.of("chat.postMessage")]


def test_a_runs_own_news_and_channel_win_and_what_it_leaves_unset_is_its_projects(
    slack, django_capture_on_commit_callbacks
):
    capture = django_capture_on_commit_callbacks
    ProjectReach.objects.create(project="infra", slack_channel="C0INFRA", slack_run_endings=False)
    quiet = ended(capture, project="infra")  # the project says no run endings
    loud = ended(capture, project="infra", slack_news=["ended"])  # the run says yes
    moved = ended(capture, project="web", slack_channel="#web-news")  # the project's news
    both = ended(capture, project="infra", slack_channel="C0ALPHA123", slack_news="ended,paused")
    assert quiet.slack_news is None and loud.slack_news == ["ended"]
    assert both.slack_news == ["ended", "paused"]
    sent = posted(slack)
    assert [channel for channel, _ in sent] == ["C0INFRA", "#web-news", "C0ALPHA123"]
    assert [text.split(":")[0] for _, text in sent] == [
        f"Run {loud.pk}",
        f"Run {moved.pk}",
        f"Run {both.pk}",
    ]


def test_off_silences_a_runs_news_but_not_its_approvals(slack, django_capture_on_commit_callbacks):
    capture = django_capture_on_commit_callbacks
    silent = ended(capture, slack_news="off")
    assert silent.slack_news == []
    run, _ = asking_run(capture, slack_news=[], slack_channel="C0ALPHA123")
    assert posted(slack) == [
        ("C0ALPHA123", f"Run {run.pk} asks to use bash")  # the approval, to the run's channel
    ]
    assert not SlackMessage.objects.filter(run=silent).exists()


def test_a_run_may_choose_which_news(slack, fake_api, django_capture_on_commit_callbacks):
    for i in range(4):  # $0.003 a turn against $0.01: warned, then paused
        fake_api.push_message(
            [{"type": "tool_use", "id": f"toolu_{i}", "name": "list_files", "input": {}}],
            stop_reason="tool_use",
            usage={"input_tokens": 1000, "output_tokens": 0},
        )
    with django_capture_on_commit_callbacks(execute=True):
        run = drive_until_idle(
            make_run(provider="anthropic", max_cost_usd=Decimal("0.01"), slack_news=["paused"])
        )
    assert run.status == "paused"
    assert posted(slack) == [("C0DEFAULT", f"Run {run.pk}: paused: {run.status_reason}")]


def test_a_fork_or_a_schedule_keeps_the_runs_slack_settings(owner):
    from agents.schedules import cron

    run = make_run(turns=[finish_turn()], slack_channel="#alpha", slack_news="budget")
    again = cron.run_from_template(run, actor="schedule:1")
    assert (again.slack_channel, again.slack_news) == ("#alpha", ["budget"])


# --- changed after creation -------------------------------------------------------------------
def test_the_run_page_changes_the_runs_slack_settings_for_who_may_control_it(slack, owner):
    run = make_run(turns=[finish_turn()], created_by=owner)
    browser = client_for(owner)
    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-slack"' in page and "ended, paused, budget to <code>C0DEFAULT</code>" in page
    assert "(its project's)" in page
    saved = browser.post(
        f"/runs/{run.pk}/slack/", {"slack_channel": "#ops", "slack_news": "budget"}, follow=True
    )
    assert "Slack settings saved" in saved.content.decode()
    run.refresh_from_db()
    assert (run.slack_channel, run.slack_news) == ("#ops", ["budget"])
    page = saved.content.decode()
    assert "budget to <code>#ops</code>" in page and "(this run's own setting)" in page
    assert Event.objects.filter(run=run, kind="run.updated", payload__slack__isnull=False).exists()

    bad = browser.post(
        f"/runs/{run.pk}/slack/",
        {"slack_channel": "#ops", "slack_news": "ended, lunch"},
        follow=True,
    )
    assert "unknown kind &#x27;lunch&#x27;" in bad.content.decode()
    bad_channel = browser.post(f"/runs/{run.pk}/slack/", {"slack_channel": "ops team"}, follow=True)
    assert "not a Slack channel" in bad_channel.content.decode()
    run.refresh_from_db()
    assert (run.slack_channel, run.slack_news) == ("#ops", ["budget"])  # nothing changed

    back = browser.post(f"/runs/{run.pk}/slack/", {"slack_channel": "", "slack_news": ""})
    assert back.status_code == 302
    run.refresh_from_db()
    assert (run.slack_channel, run.slack_news) == ("", None)  # the project's again

    watcher = user_with("vic", "view_run")
    assert 'id="run-slack"' not in client_for(watcher).get(f"/runs/{run.pk}/").content.decode()
    refused = client_for(watcher).post(f"/runs/{run.pk}/slack/", {"slack_news": "off"})
    assert refused.status_code == 403
    assert Client().post(f"/runs/{run.pk}/slack/", {"slack_news": "off"}).status_code == 302
    run.refresh_from_db()
    assert run.slack_news is None


def test_the_api_sets_a_runs_slack_settings_at_creation_and_later(owner):
    _, token = ApiToken.issue(owner, ["write"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {token}")

    def post(path, body):
        return api.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")

    made = post("/runs", {"goal": "g", "checks": ["true"], "slack_news": ["off"]})
    assert made.status_code == 201, made.content
    assert (made.json()["slack_news"], made.json()["slack_channel"]) == ([], "")
    run_id = made.json()["id"]
    bad = post("/runs", {"goal": "g", "checks": ["true"], "slack_news": ["ended", "sometimes"]})
    assert bad.status_code == 422 and "unknown kind 'sometimes'" in bad.json()["detail"]
    bad = post("/runs", {"goal": "g", "checks": ["true"], "slack_channel": "general"})
    assert bad.status_code == 422 and "not a Slack channel" in bad.json()["detail"]

    changed = post(f"/runs/{run_id}/slack", {"slack_channel": "C0ALPHA123"})
    assert changed.status_code == 200, changed.content
    assert (changed.json()["slack_channel"], changed.json()["slack_news"]) == ("C0ALPHA123", [])
    changed = post(f"/runs/{run_id}/slack", {"slack_news": None})  # back to the project's
    assert changed.json()["slack_news"] is None and changed.json()["slack_channel"] == "C0ALPHA123"
    refused = post(f"/runs/{run_id}/slack", {"slack_news": ["lunch"]})
    assert refused.status_code == 422 and "unknown kind 'lunch'" in refused.json()["detail"]
    typo = post(f"/runs/{run_id}/slack", {"slack_newz": ["ended"]})
    assert typo.status_code == 422

    other = user_with("vic", "view_run")
    _, theirs = ApiToken.issue(other, ["write"])
    watcher = Client(HTTP_AUTHORIZATION=f"Bearer {theirs}")
    body = json.dumps({"slack_news": ["ended"]})
    refused = watcher.post(f"/api/v1/runs/{run_id}/slack", body, content_type="application/json")
    assert refused.status_code == 403
    assert Run.objects.get(pk=run_id).slack_news is None


def test_the_cli_sets_a_runs_slack_settings(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "SLACK_BOT_TOKEN": "xoxb-t", "SLACK_CHANNEL": "C0D"}
    run = make_run(turns=[finish_turn()])
    out = StringIO()
    call_command("reach", run=run.pk, channel="#alpha", news="ended,budget", stdout=out)
    assert f"run {run.pk}: Slack channel #alpha, run news ended, budget (its own settings)" in (
        out.getvalue()
    )
    call_command("reach", run=run.pk, news="off", stdout=out)
    assert "run news none (its own settings)" in out.getvalue()
    call_command("reach", run=run.pk, channel="", news="project", stdout=out)
    assert "Slack channel C0D, run news ended, paused, budget (its project's settings)" in (
        out.getvalue()
    )
    with pytest.raises(CommandError, match="unknown kind 'tea'"):
        call_command("reach", run=run.pk, news="tea", stdout=out)
    with pytest.raises(CommandError, match="not a Slack channel"):
        call_command("reach", run=run.pk, channel="alpha", stdout=out)
    with pytest.raises(CommandError, match="no run with id 99999"):
        call_command("reach", run=99999, news="off", stdout=out)
    with pytest.raises(CommandError, match="give --run"):
        call_command("reach", news="off", stdout=out)
    with pytest.raises(CommandError, match="unknown kind 'lunch'"):
        call_command("create_run", "--goal", "g", "--check", "true", "--slack-news", "lunch")


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("slack_news", "ended, lunch", "unknown kind 'lunch'"),
        ("slack_channel", "general", "not a Slack channel"),
    ],
)
def test_the_new_run_form_says_what_is_wrong_on_the_field(field, value, words):
    person = user_with("wendy", "view_run", "control_run", "add_run")
    form = {"goal": "g", "checks": "true", "provider": "external", field: value}
    r = client_for(person).post("/runs/new/", form)
    assert r.status_code == 400
    assert any(words in e for e in r.context["form"].errors.get(field, [])), r.context[
        "form"
    ].errors
    assert not Run.objects.exists()


def test_the_new_run_form_takes_them_and_run_again_fills_them_in():
    person = user_with("wendy", "view_run", "control_run", "add_run")
    form = {"goal": "g", "checks": "true", "provider": "external"}
    form |= {"slack_channel": "#ops", "slack_news": "off"}
    assert client_for(person).post("/runs/new/", form).status_code == 302
    run = Run.objects.get()
    assert (run.slack_channel, run.slack_news) == ("#ops", [])
    again = client_for(person).get(f"/runs/new/?from={run.pk}").content.decode()
    assert 'name="slack_channel" value="#ops"' in again and 'value="off"' in again
