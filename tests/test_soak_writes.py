"""The chaos soak's account of writes (bench/soak/writes.py): a succeeded run's last committed
workspace holds every write whose result is on its live branch, rewinds included; a write lost
from it is found and named."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from agents import checkpoints, rewinds, services
from agents.models import Checkpoint, Run, RunStatus
from agents.runspec import RunSpec
from tests.helpers import approve_pending, drive_until_idle

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from soak.load import script
from soak.writes import lost_writes

pytestmark = pytest.mark.django_db


def soak_run(seed: int, *, risky: bool = False) -> Run:
    return services.create_run(
        RunSpec(
            goal="like the soak's",
            checks=["true"],
            script=script(random.Random(seed), turns=10, risky=risky, delay=0),
            max_turns_per_session=3,
        )
    )


def test_a_soak_run_and_a_rewound_one_lose_nothing(decider):
    plain = drive_until_idle(soak_run(1))
    assert plain.status == RunStatus.SUCCEEDED, plain.status_reason
    # The risky call waits for a person half way: rewound from there to an earlier checkpoint,
    # the run writes its files again on a new branch, and the abandoned one is left out.
    rewound = drive_until_idle(soak_run(2, risky=True))
    assert rewound.status == RunStatus.AWAITING_APPROVAL, rewound.status_reason
    earlier = Checkpoint.objects.filter(run=rewound).order_by("seq")[1]
    rewinds.rewind(rewound.pk, earlier.pk, actor="user:eve")
    for _ in range(3):
        rewound = drive_until_idle(rewound)
        if rewound.status != RunStatus.AWAITING_APPROVAL:
            break
        approve_pending(rewound, decider)
    assert rewound.status == RunStatus.SUCCEEDED, rewound.status_reason
    assert rewound.events.filter(kind="run.rewound").exists()
    assert lost_writes([plain.pk, rewound.pk]) == (2, 0, [])


def test_a_write_missing_from_the_last_committed_workspace_is_found():
    run = drive_until_idle(soak_run(3))
    assert run.status == RunStatus.SUCCEEDED
    workspace = run.workspace_path
    written = sorted((workspace / "work").iterdir())
    assert written, "the script wrote nothing"
    written[0].unlink()
    with (workspace / "log.txt").open("a") as log:
        log.write("turn 99\n")
    checkpoints.create(run.pk, kind="manual", label="tampered", actor="user:eve")
    checked, lost, lines = lost_writes([run.pk])
    assert (checked, lost) == (1, 1), lines
    text = "\n".join(lines)
    assert f"work/{written[0].name} holds nothing" in text
    assert "log.txt has" in text


def test_an_append_whose_command_failed_afterwards_may_have_happened():
    """Found by the soak (a false alarm: "log.txt has 4 lines; its committed appends make 3"): as
    it fills the disk, the disk watch kills a command after its `echo` appended. A failed append
    may have happened; one more line than that is still found."""
    from tests.helpers import call, finish_turn

    turns = [
        {"text": "log", "tool_calls": [call("bash", command="echo turn 0 >> log.txt; exit 3")]},
        {"text": "log", "tool_calls": [call("bash", command="echo turn 1 >> log.txt")]},
        finish_turn(),
    ]
    run = drive_until_idle(
        services.create_run(RunSpec(goal="g", checks=["true"], script={"turns": turns}))
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    assert run.events.filter(kind="tool.result", payload__is_error=True).count() == 1
    assert lost_writes([run.pk]) == (1, 0, [])
    with (run.workspace_path / "log.txt").open("a") as log:
        log.write("turn 99\n")
    checkpoints.create(run.pk, kind="manual", label="tampered", actor="user:eve")
    checked, lost, lines = lost_writes([run.pk])
    assert (checked, lost) == (1, 1)
    assert "log.txt has 3 lines; its committed appends make 1 (up to 2 with" in lines[0]
