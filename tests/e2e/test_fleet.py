"""Seeing a fleet in a real browser against a real `serve`: the parent's Fleet panel follows its
children without a reload (a child ends, a new one is spawned, the fleet's spend moves), a run
whose first children are spawned while its page is open grows the panel, the runs list groups by
fleet, the timeline shows the children as lanes; axe finds nothing serious on these pages.

The fleet is made by hand in the test process (rows with `parent` set, events appended through the
event log), as the fleet runtime writes them; its children hold a lease far in the future, so the
server's workers and reaper leave them alone.

Set SHIFTLOG_SCREENSHOTS=DIR to keep the screenshots.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from agents import eventlog
from agents.models import Run, RunStatus, Session
from tests.e2e.helpers import BROWSER_TEST, log_in, screenshot, serving, wait_js
from tests.e2e.scenes import PHONE
from tests.e2e.test_accessibility import violations
from tests.timeline_runs import turn

pytestmark = BROWSER_TEST


def run_of(eve, goal: str, *, parent: Run | None = None, status=RunStatus.RUNNING, **usage) -> Run:
    """A run no worker takes: a lease held far into the future."""
    run = Run.objects.create(
        goal=goal,
        model="scripted",
        created_by=eve,
        parent=parent,
        depth=parent.depth + 1 if parent else 0,
        status=status,
        lease_owner="worker:elsewhere",
        lease_expires_at=timezone.now() + timedelta(hours=1),
        **usage,
    )
    eventlog.append(run.pk, "run.created", {"goal": goal})
    return run


def work(run: Run, turns: int) -> None:
    """A session of turns and tool calls in the run's log (what the timeline's lanes show)."""
    s = Session.objects.create(run=run, index=1, turns=turns)
    eventlog.append(run.pk, "session.started", {"index": 1}, session_id=s.pk)
    for i in range(turns):
        eventlog.append(run.pk, "model.turn", turn(300, 100, 10, "0.001", "bash"), session_id=s.pk)
        eventlog.append(
            run.pk,
            "tool.call",
            {"tool_use_id": f"t{i}", "name": "bash", "input": {}},
            session_id=s.pk,
        )
        eventlog.append(
            run.pk,
            "tool.result",
            {"tool_use_id": f"t{i}", "name": "bash", "output": "ok", "is_error": False},
            session_id=s.pk,
        )
    Run.objects.filter(pk=run.pk).update(turns=turns)


def spawn(parent: Run, kids: list[Run]) -> None:
    eventlog.append(
        parent.pk,
        "fleet.spawned",
        {
            "children": [
                {"run_id": k.pk, "goal": k.goal, "budget_tokens": 20000,
                 "budget_cost_usd": "0.50", "from": "checkpoint 1"}
                for k in kids
            ]
        },
    )  # fmt: skip


def end(parent: Run, kid: Run, status: str, cost: str) -> None:
    """What the runtime does when a child ends, as far as the pages are concerned."""
    Run.objects.filter(pk=kid.pk).update(
        status=status, cost_usd=Decimal(cost), lease_owner="", lease_expires_at=None
    )
    eventlog.append(kid.pk, "run.status", {"from": "running", "to": status})
    eventlog.append(parent.pk, "fleet.child_ended", {"run_id": kid.pk, "status": status})


def status_in_tree(page, run_id: int) -> str:
    return page.inner_text(f"#fleet-run-{run_id} .run-status")


def test_a_parents_tree_follows_its_children_live_and_the_list_and_timeline_show_the_fleet(
    pages, eve, tmp_path, shots
):
    with serving(tmp_path) as base:
        parent = run_of(
            eve,
            "Split the parser work: tokenizer and evaluator, each with its tests",
            status=RunStatus.WAITING_FOR_CHILDREN,
            input_tokens=1800,
            output_tokens=400,
            cost_usd=Decimal("0.042"),
        )
        work(parent, 2)
        a = run_of(eve, "Write tokenizer.py and its tests", parent=parent,
                   input_tokens=5200, output_tokens=900, cost_usd=Decimal("0.061"))  # fmt: skip
        b = run_of(eve, "Write evaluator.py and its tests", parent=parent,
                   input_tokens=3100, output_tokens=700, cost_usd=Decimal("0.037"))  # fmt: skip
        grand = run_of(eve, "Property tests for the evaluator", parent=b,
                       status=RunStatus.AWAITING_APPROVAL, input_tokens=800, output_tokens=90,
                       cost_usd=Decimal("0.009"))  # fmt: skip
        for kid, n in ((a, 4), (b, 3), (grand, 1)):
            work(kid, n)
        spawn(parent, [a, b])
        lone = run_of(eve, "A run of its own", status=RunStatus.PAUSED)

        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{parent.pk}/")
        page.wait_for_selector(f"#fleet-run-{a.pk}")
        page.wait_for_selector("#live-state.on")
        assert status_in_tree(page, a.pk) == "Running"
        assert "Awaiting approval" in status_in_tree(page, grand.pk)
        assert "(fleet $0.1490)" in page.inner_text("#meters")
        page.evaluate("window.__not_reloaded = true")
        page.screenshot(path=str(shots / "fleet-parent.png"), full_page=True)
        assert not violations(page)

        # a child ends: its row and the fleet's spend follow, without a reload
        end(parent, a, RunStatus.SUCCEEDED, "0.080")
        wait_js(page, f"document.querySelector('#fleet-run-{a.pk} .run-status')"
                      ".textContent.includes('Succeeded')", timeout=15_000)  # fmt: skip
        wait_js(page, "document.querySelector('#meters').textContent.includes('(fleet $0.1680)')")
        assert page.evaluate("window.__not_reloaded === true")
        # and the parent's stream shows the event, with a link to the child
        page.wait_for_selector(f".fleet-child_ended a[href='/runs/{a.pk}/']")

        # a new child is spawned: it joins the tree
        c = run_of(eve, "Glue: the CLI that uses both", parent=parent)
        spawn(parent, [c])
        page.wait_for_selector(f"#fleet-run-{c.pk}", timeout=15_000)
        assert page.evaluate("window.__not_reloaded === true")
        page.screenshot(path=str(shots / "fleet-parent-later.png"), full_page=True)

        # a run with no child when its page opened (no panel, nothing polling) grows one
        solo = run_of(eve, "Starts alone, spawns later", status=RunStatus.RUNNING)
        page.goto(f"{base}/runs/{solo.pk}/")
        page.wait_for_selector("#live-state.on")
        assert page.locator("#fleet").is_hidden()
        late = run_of(eve, "Spawned while watched", parent=solo)
        spawn(solo, [late])
        page.wait_for_selector(f"#fleet-run-{late.pk}", timeout=15_000)
        assert page.locator("#fleet").is_visible()

        # the child's page names its fleet
        page.goto(f"{base}/runs/{b.pk}/")
        assert page.get_attribute("#fleet-of a", "href") == f"/runs/{parent.pk}/"

        # the runs list grouped by fleet: each root, its tree below it
        page.goto(f"{base}/?group=fleet")
        ids = page.eval_on_selector_all("#run-rows tr[id^=run-]", "els => els.map(e => e.id)")
        order = [ids.index(f"run-{r.pk}") for r in (parent, a, b, grand, c)]
        assert order == sorted(order) and order[-1] - order[0] == 4  # nothing in between
        assert ids.index(f"run-{lone.pk}") < order[0]  # a newer root, above
        assert page.locator(f"#run-{grand.pk}.depth-2").count() == 1
        page.screenshot(path=str(shots / "fleet-grouped-list.png"), full_page=True)
        assert not violations(page)
        # and "fleets only" by its select leaves the lone run out
        page.select_option("select[name=fleet]", "only")
        wait_js(page, f"!document.getElementById('run-{lone.pk}')")
        assert page.locator(f"#run-{parent.pk}").count() == 1

        # the timeline: a lane a child, below the parent's own
        page.goto(f"{base}/runs/{parent.pk}/timeline/")
        wait_js(page, "document.querySelector('#timeline').dataset.drawn")
        label = page.get_attribute("#tl-canvas", "aria-label")
        assert "3 child runs as lanes below" in label, label
        page.click("#tl-table-box summary")
        table = page.inner_text("#tl-table")
        assert f"child #{a.pk}" in table and f"child #{b.pk}" in table
        link = page.get_attribute(f"#tl-table tr:has-text('child #{a.pk}') a", "href")
        assert link.startswith(f"/runs/{a.pk}/events/")
        page.screenshot(path=str(shots / "fleet-timeline.png"), full_page=True)

        # in dark too, axe finds nothing serious on the tree and the grouped list
        dark = pages(color_scheme="dark")
        log_in(dark, base)
        for path in (f"/runs/{parent.pk}/", "/?group=fleet"):
            dark.goto(base + path)
            assert not violations(dark), path
        dark.goto(f"{base}/runs/{parent.pk}/")
        screenshot(dark, "#fleet", shots / "fleet-panel-dark.png")

        # on a phone the tree is one block a run; the page itself does not widen
        phone = pages(**PHONE)
        log_in(phone, base)
        for path in (f"/runs/{parent.pk}/", "/?group=fleet"):
            phone.goto(base + path)
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["viewport"]["width"], (path, width)
        phone.goto(f"{base}/runs/{parent.pk}/")
        screenshot(phone, "#fleet", shots / "fleet-panel-phone.png")


def test_the_fleet_demo_tree_follows_its_children_live_through_an_approval(tmp_path, pages, eve):
    """`manage.py demo fleet` on a real `serve`: the planner's page shows its two children appear,
    one wait for a person (approved on the child's own page), both end, and the planner merge and
    succeed, without a reload."""
    import subprocess
    import sys

    from agents.models import Approval
    from tests.e2e.helpers import serve_env
    from tests.procs import BASE_DIR, wait_for

    with serving(tmp_path, SHIFTLOG_DEMO_TURN_DELAY="0.2") as base:
        made = subprocess.run(
            [sys.executable, "manage.py", "demo", "fleet"],
            cwd=BASE_DIR,
            env=serve_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
        planner = int(made.stdout.strip().splitlines()[-1])
        page = pages()
        log_in(page, base)
        page.goto(f"{base}/runs/{planner}/")
        rows = "document.querySelectorAll('#fleet tr.fleet-node')"
        wait_js(page, f"{rows}.length >= 2", timeout=120_000)

        waiting = wait_for(
            lambda: Approval.objects.filter(run__parent_id=planner, status="pending").first(),
            timeout=120,
            what="a child's risky step to wait for a person",
        )
        child = waiting.run_id
        wait_js(
            page,
            f"document.querySelector('#fleet-run-{child}')?.dataset.status === 'awaiting_approval'",
            timeout=30_000,
        )
        # The planner's rewind to its start would cancel the children still running: its
        # confirm panel says which, before anything is done.
        start = Run.objects.get(pk=planner).checkpoints.get(kind="run_start")
        page.click(f"#checkpoint-{start.number} a:has-text('Rewind')")
        panel = page.wait_for_selector("#checkpoint-action #confirm-panel", timeout=10_000)
        assert "are cancelled" in panel.inner_text(), panel.inner_text()
        assert page.locator(f"#confirm-panel .d-children a[href='/runs/{child}/']").count() == 1
        assert Run.objects.get(pk=planner).status == RunStatus.WAITING_FOR_CHILDREN

        other = page.context.new_page()
        other.goto(f"{base}/runs/{child}/")
        other.click(".approval.a-pending button[value=approve]", timeout=30_000)
        other.wait_for_selector(".approval.a-approved", timeout=15_000)
        other.close()

        # Without a reload: every child ends as succeeded in the tree, then the planner does.
        wait_js(
            page,
            f"[...{rows}].length >= 2 && [...{rows}].every(r => r.dataset.status === 'succeeded')",
            timeout=180_000,
        )
        wait_for(
            lambda: Run.objects.get(pk=planner).status == RunStatus.SUCCEEDED,
            timeout=120,
            what="the planner to merge its children's work and succeed",
        )
        wait_js(page, "document.querySelector('#events').textContent.includes('merge')")
        assert page.evaluate("() => performance.getEntriesByType('navigation').length") == 1
