"""The chaos soak's account of what its WebSocket viewers saw (bench/chaos.py, bench/soak/):
a viewer leaves once it has seen its run end, so an event a person's late act appends to an
ended run afterwards (a refused rewind's error) is not counted as missing from it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agents import eventlog
from agents.events import EventKind
from agents.models import Run, RunStatus
from tests.helpers import make_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from chaos import _mark_finished
from soak.viewers import Viewers, Watch

pytestmark = pytest.mark.django_db


class Person:
    """What _mark_finished needs of the soak's simulated person."""

    def __init__(self, created: list[int]):
        self.created = created

    def attempt(self, name, fn):
        return fn()


def test_an_event_appended_after_a_viewer_saw_the_run_end_is_not_its_to_see():
    run = make_run()
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    ended_at = Run.objects.get(pk=run.pk).last_seq
    viewers = Viewers(port=0, cookie="", count=0)
    person = Person([run.pk])
    _mark_finished(person, viewers)
    assert viewers.finished_runs == {run.pk: ended_at}
    watch = Watch(run.pk, seqs=list(range(1, ended_at + 1)))  # left once it saw the end
    # A rewind asked before the run ended is refused after: its error is appended later.
    eventlog.append(
        run.pk,
        EventKind.ERROR,
        {"source": "rewind", "message": "the rewind to checkpoint 2 was not done"},
        actor="user:chaos",
    )
    _mark_finished(person, viewers)
    assert viewers.finished_runs == {run.pk: ended_at}
    last = Run.objects.get(pk=run.pk).last_seq
    assert last == ended_at + 1
    upto = min(last, viewers.finished_runs[run.pk])  # as bench/soak/account.py counts
    assert watch.problems(upto) == 0
    # One still there when the late event came got it too: no problem either.
    assert Watch(run.pk, seqs=list(range(1, last + 1))).problems(upto) == 0
    assert Watch(run.pk, seqs=[*range(1, last + 1), last]).problems(upto) >= 1  # doubled
    # A viewer that missed an event before the end is still caught.
    assert Watch(run.pk, seqs=list(range(1, ended_at))).problems(upto) == 1
