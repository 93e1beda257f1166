"""Finding things in a run: its events narrowed by kind, tool, text, failures and session, an
event in its context, the first failure; in the web and through `tail_run`."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from agents.models import Event
from tests.helpers import call, client_for, drive_until_idle, finish_turn, make_run

TURNS = [
    {"text": "Writing the notes.", "tool_calls": [call("write_file", path="n.txt", content="naïve café\n")]},
    {"text": "Looking around.", "tool_calls": [call("bash", command="ls; cat missing.txt")]},
    {"text": "Reading.", "tool_calls": [call("read_file", path="n.txt")]},
    finish_turn(),
]  # fmt: skip


@pytest.fixture
def run(owner):
    return drive_until_idle(
        make_run(turns=TURNS, checks=["test -f n.txt", "test -f absent.txt"], created_by=owner)
    )


def seqs(html: str) -> list[int]:
    return [int(part.split('"')[0]) for part in html.split('data-seq="')[1:]]


def find(user, run, **params):
    return client_for(user).get(f"/runs/{run.pk}/find/", params)


def test_each_filter_narrows_the_events(owner, run):
    events = Event.objects.filter(run=run)
    calls = list(events.filter(kind="tool.call").values_list("seq", flat=True))
    assert seqs(find(owner, run, kind="tool.call").content.decode()) == calls
    bash = events.filter(kind__in=["tool.call", "tool.result"], payload__name="bash")
    assert seqs(find(owner, run, tool="bash").content.decode()) == sorted(
        bash.values_list("seq", flat=True)
    )
    # Text anywhere in the payload, any case, non-ASCII too.
    cafe = seqs(find(owner, run, q="CAFÉ").content.decode())
    assert cafe and all("café" in str(events.get(seq=s).payload).lower() for s in cafe)
    failures = seqs(find(owner, run, errors="on").content.decode())
    kinds = [events.get(seq=s).kind for s in failures]
    assert "tool.result" in kinds and "check.result" in kinds  # cat missing.txt; absent.txt
    assert all(
        (e.kind == "tool.result" and e.payload["is_error"])
        or (e.kind == "check.result" and not e.payload["passed"])
        or e.kind in {"check.regressed", "run.status"}
        for e in (events.get(seq=s) for s in failures)
    )
    first_session = run.sessions.get(index=1)
    in_one = seqs(find(owner, run, session="1").content.decode())
    assert in_one == list(
        events.filter(session=first_session).order_by("seq").values_list("seq", flat=True)
    )
    assert "No event matches" in find(owner, run, session="9").content.decode()
    both = seqs(find(owner, run, kind="tool.result", errors="on").content.decode())
    assert both and set(both) <= set(failures)


def test_the_first_failure_opens_in_its_context(owner, run):
    c = client_for(owner)
    first = Event.objects.filter(run=run).failures().order_by("seq").first()
    response = c.get(f"/runs/{run.pk}/first-failure")
    assert response.status_code == 302
    assert response["Location"] == f"/runs/{run.pk}/events/{first.seq}/#seq-{first.seq}"
    html = c.get(f"/runs/{run.pk}/events/{first.seq}/").content.decode()
    assert f'id="seq-{first.seq}"' in html
    # ?around=N (an older link) opens the same place.
    around = c.get(f"/runs/{run.pk}/find/", {"around": first.seq})
    assert around["Location"] == response["Location"]
    # A run without failures says so.
    clean = drive_until_idle(make_run(turns=[finish_turn()], created_by=owner))
    none = c.get(f"/runs/{clean.pk}/first-failure")
    assert none["Location"] == f"/runs/{clean.pk}/find/?errors=on"
    assert "No event matches" in c.get(none["Location"]).content.decode()


def test_the_run_page_links_each_event_and_the_tools(owner, run):
    html = client_for(owner).get(f"/runs/{run.pk}/").content.decode()
    assert f'href="/runs/{run.pk}/events/1/#seq-1"' in html
    assert f'href="/runs/{run.pk}/first-failure"' in html and "Find events…" in html


def test_pages_of_results(owner, run, monkeypatch):
    from dashboard import find_views

    monkeypatch.setattr(find_views, "PAGE", 3)
    c = client_for(owner)
    first = c.get(f"/runs/{run.pk}/find/", {"q": "e"}).content.decode()
    assert len(seqs(first)) == 3 and "More</a>" in first
    after = seqs(first)[-1]
    nxt = c.get(f"/runs/{run.pk}/find/", {"q": "e", "after": after}).content.decode()
    assert seqs(nxt) and min(seqs(nxt)) > after


@pytest.mark.parametrize(
    "params",
    [
        {"kind": "no.such"},
        {"session": "x"},
        {"session": "0"},
        {"around": "-1"},
        {"after": "9" * 40},
        {"q": "x" * 201},
        {"q": "a\x00b"},
    ],
)
def test_bad_parameters_are_a_400_with_the_reason(owner, run, params):
    response = find(owner, run, **params)
    assert response.status_code == 400
    assert 'class="errorlist"' in response.content.decode()


def test_who_may_look(run, viewer, outsider, client):
    assert find(viewer, run, q="x").status_code == 200
    assert find(outsider, run, q="x").status_code == 404
    assert client_for(outsider).get(f"/runs/{run.pk}/first-failure").status_code == 404
    anonymous = client.get(f"/runs/{run.pk}/find/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]
    assert client_for(viewer).post(f"/runs/{run.pk}/find/").status_code == 405


def tail(*args: str) -> list[str]:
    out = StringIO()
    call_command("tail_run", *args, stdout=out)
    return out.getvalue().splitlines()


def test_tail_run_filters_alike(run):
    web = Event.objects.filter(run=run).failures().order_by("seq")
    lines = tail(str(run.pk), "--errors")
    assert [int(line.split()[0][1:]) for line in lines] == [e.seq for e in web]
    assert all("bash" in line for line in tail(str(run.pk), "--tool", "bash"))
    assert tail(str(run.pk), "--grep", "CAFÉ")
    assert all(" tool.call " in line for line in tail(str(run.pk), "--kind", "tool.call"))
    # --follow on a finished run with a filter returns (it does not wait on skipped events).
    assert tail(str(run.pk), "--follow", "--kind", "run.created")
    for args, message in [
        (["--session", "9"], "has no session 9"),
        (["--grep", "x" * 201], "up to 200 characters"),
    ]:
        with pytest.raises(CommandError, match=message) as info:
            tail(str(run.pk), *args)
        assert info.value.returncode == 2
