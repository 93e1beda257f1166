"""What the layout, accessibility and keyboard tests look at: a demo run waiting for a person,
and the pages it gives (runs list, run page, inbox, a checkpoint panel, a diff, the new-run form).
"""

from __future__ import annotations

from agents import services
from agents.models import Run, RunStatus
from tests.procs import wait_for

PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}

# A line no phone holds: the diff page must scroll it inside its box, not the page.
LONG_LINE = "wide = " + repr("x" * 400) + "\n"


def waiting_demo(eve) -> Run:
    """The demo, run by the server's worker until its risky step waits for a person."""
    run = services.create_demo_run(created_by=eve, turn_delay_seconds=0)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.AWAITING_APPROVAL,
        timeout=120,
        what=f"run {run.pk} to wait for approval",
        interval=0.2,
    )
    return Run.objects.get(pk=run.pk)


def page_urls(run: Run) -> dict[str, str]:
    """Path of each page worth checking, by name. The live workspace gets a long line first, so
    the diff against it has one."""
    first = run.checkpoints.order_by("seq").first()
    (run.workspace_path / "wide.py").write_text(LONG_LINE)
    return {
        "runs list": "/",
        "run page": f"/runs/{run.pk}/",
        "approvals": "/approvals/",
        "checkpoint": f"/runs/{run.pk}/checkpoints/{first.number}/rewind",
        "diff": f"/runs/{run.pk}/diff/?a={first.number}&b=live",
        "new run": "/runs/new/?demo=1",
    }
