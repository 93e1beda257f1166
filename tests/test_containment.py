"""Containment, as the runtime applies it: a run does not start where commands cannot be
isolated (unless the operator says so, and then it says so too), each run's limits, toolchain
and network rules reach its commands and checks, and a new host is asked of a person."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agents import approvals, services
from agents.models import Approval, Event, Run, RunStatus
from agents.sandbox import isolation_available
from tests.helpers import call, drive_until_idle, finish_turn, make_run

pytestmark = pytest.mark.django_db
needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap", reason="bubblewrap is not usable here"
)


def results(run: Run) -> list[dict]:
    return list(
        Event.objects.filter(run=run, kind="tool.result")
        .order_by("seq")
        .values_list("payload", flat=True)
    )


# --- may a run start here? --------------------------------------------------------------------
def test_a_run_does_not_start_where_commands_cannot_be_isolated(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ISOLATION": "subprocess", "ALLOW_UNISOLATED": False}
    run = drive_until_idle(make_run(turns=[{"tool_calls": [call("bash", command="touch x")]}]))
    assert run.status == RunStatus.PAUSED
    assert "cannot be isolated" in run.status_reason
    assert "SHIFTLOG_ALLOW_UNISOLATED=1" in run.status_reason
    assert not (run.workspace_path / "x").exists()  # nothing ran
    assert not Event.objects.filter(run=run, kind="tool.call").exists()


def test_an_operator_may_allow_unisolated_runs_and_they_say_so(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "ISOLATION": "subprocess", "ALLOW_UNISOLATED": True}
    run = drive_until_idle(make_run(turns=[finish_turn()]))
    assert run.status == RunStatus.SUCCEEDED and run.isolation == "subprocess" and run.unisolated
    said = Event.objects.get(run=run, kind="run.isolation")
    assert said.payload["unisolated"] is True and said.payload["isolation"] == "subprocess"


@needs_bwrap
def test_the_isolation_a_run_records_is_that_of_its_latest_slice(settings):
    run = make_run(turns=[{"tool_calls": [call("bash", command="true")]}, finish_turn()])
    Run.objects.filter(pk=run.pk).update(isolation="subprocess")  # an earlier worker's
    run = drive_until_idle(run)
    assert run.isolation == "bwrap" and not run.unisolated
    said = Event.objects.filter(run=run, kind="run.isolation").get()
    assert said.payload == {**said.payload, "isolation": "bwrap", "unisolated": False}
    assert results(run)[0]["data"]["isolation"] == "bwrap"


# --- limits -----------------------------------------------------------------------------------
@needs_bwrap
def test_a_runs_memory_limit_reaches_its_commands():
    code = "x = bytearray(400 * 1024 * 1024)\nprint(len(x))\n"
    turns = [
        {"tool_calls": [call("write_file", path="grab.py", content=code)]},
        {"tool_calls": [call("bash", command="python3 grab.py")]},
        finish_turn(),
    ]
    small = make_run(turns=turns, limits={"memory_mb": 64})
    big = make_run(turns=turns)
    small, big = drive_until_idle(small), drive_until_idle(big)
    refused, allowed = results(small)[1], results(big)[1]
    assert refused["is_error"] and allowed["data"]["exit_code"] == 0, (refused, allowed)
    assert small.limits["memory_mb"] == 64 and big.limits["memory_mb"] == 2048


@needs_bwrap
def test_a_workspace_past_its_cap_pauses_the_run_with_the_reason(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 1}
    fill = "head -c 3000000 /dev/zero > big.bin"
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=fill)]},
            {"tool_calls": [call("bash", command="echo never")]},
            finish_turn(),
        ],
        limits={"workspace_mb": 2},
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.PAUSED
    assert "over its cap of 2 MB" in run.status_reason
    assert "echo never" not in str(results(run))
    # Freed and raised, it goes on.
    (run.workspace_path / "big.bin").unlink()
    services.resume_run(run.pk, actor="test")


def test_a_command_writing_past_the_cap_and_deleting_it_is_stopped_while_it_runs(settings):
    settings.SHIFTLOG = {**settings.SHIFTLOG, "CHECKPOINT_EVERY": 1}
    # 300 MB written and deleted in one command: a checkpoint after it would see nothing. (The
    # watcher looks every 20 ms: what a command writes and deletes between two looks, tens of MB
    # at page-cache speed, can pass unseen; a disk is not filled that fast.)
    fill = "head -c 300000000 /dev/zero > big.bin; rm big.bin; echo finished"
    # A file tool after it takes a checkpoint (every 1), which finds what the stopped command
    # left over the cap and pauses the run.
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=fill)]},
            {"tool_calls": [call("write_file", path="note.txt", content="x")]},
            finish_turn(),
        ],
        limits={"workspace_mb": 2},
    )
    run = drive_until_idle(run)
    said = str(results(run))
    assert "the workspace reached its cap of 2 MiB while the command ran" in said
    assert "finished" not in said
    assert run.status == RunStatus.PAUSED and "over its cap of 2 MB" in run.status_reason


def test_a_runs_commands_get_its_workspace_cap_and_the_floor_from_the_settings(settings):
    from agents import isolation
    from agents.sandbox.limits import MiB

    settings.SHIFTLOG = {**settings.SHIFTLOG, "MIN_FREE_MB": 300}
    run = make_run(limits={"workspace_mb": 1024})
    limits = isolation.limits_for(run)
    assert limits.workspace_bytes == 1024 * MiB and limits.min_free_bytes == 300 * MiB


@pytest.mark.parametrize(
    ("limits", "said"),
    [
        ({"memory_mb": 1}, "at least 16"),
        ({"processes": 10**9}, "at most"),
        ({"bandwidth": 5}, "unknown limit"),
        ({"cpu_seconds": "NaN"}, "whole number"),
    ],
)
def test_bad_limits_are_refused_clearly(limits, said):
    with pytest.raises(services.RunError, match=said):
        make_run(turns=[finish_turn()], limits=limits)


# --- the environment commands and checks run in ------------------------------------------------
@needs_bwrap
def test_commands_and_checks_run_in_the_named_environment(tmp_path):
    venv = tmp_path / "env"
    import venv as venvs

    venvs.create(venv, with_pip=False)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "only_in_the_env.py").write_text("MARK = 'from the env'\n")
    check = "python3 -c 'import only_in_the_env'"
    run = make_run(
        turns=[
            {
                "tool_calls": [
                    call("write_file", path="where.py", content="import sys\nprint(sys.prefix)\n")
                ]
            },
            {"tool_calls": [call("bash", command="python3 where.py")]},
            finish_turn(),
        ],
        checks=[check],
        environment=str(venv),
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason  # the check imported it
    assert str(venv.resolve()) in results(run)[1]["output"]
    # Without it, the same check cannot pass: the module is nowhere else.
    plain = drive_until_idle(make_run(turns=[finish_turn()], checks=[check]))
    assert plain.status != RunStatus.SUCCEEDED


@pytest.mark.any_db  # a venv built with pip: once, on SQLite
def test_a_check_environment_is_built_from_requirements_or_refused_clearly(tmp_path):
    empty = tmp_path / "requirements.txt"
    empty.write_text("# nothing needed\n")
    run = make_run(turns=[finish_turn()], requirements=str(empty))
    built = Path(run.toolchain[0])
    assert (built / "bin" / "python").exists() and (built / "pyvenv.cfg").exists()
    assert not built.is_relative_to(run.workspace_path)  # out of the agent's reach
    broken = tmp_path / "broken.txt"
    broken.write_text("!!! not a requirement\n")
    with pytest.raises(services.RunError, match="building the check environment failed"):
        make_run(turns=[finish_turn()], requirements=str(broken))
    with pytest.raises(services.RunError, match="does not exist"):
        make_run(turns=[finish_turn()], environment=str(tmp_path / "nope"))


# --- the network ------------------------------------------------------------------------------
HOST = "127.0.0.2"


class Site:
    """A web server on this machine's loopback, reached only through a run's egress proxy."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"hello from the site\n"
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        # 127.0.0.2: the sandbox reaches its own 127.0.0.1 directly (NO_PROXY), and that is
        # not this machine's; another loopback address goes through the proxy like any host.
        self.server = ThreadingHTTPServer((HOST, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]
        self.url = f"http://{HOST}:{self.port}/page"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site(settings):
    # The site is on loopback, which the proxy refuses by default (this machine's services).
    settings.SHIFTLOG = {**settings.SHIFTLOG, "EGRESS_ALLOW_PRIVATE": True}
    started = Site()
    yield started
    started.close()


def fetch(site: Site) -> str:
    return f"curl -s -o page.txt -w '%{{http_code}}' {site.url}; echo"


# The tool policy lets the command itself run (curl would ask as a risky command first): what
# is tested is the second gate, the run's network.
CURL_ALLOWED = [{"tool": "bash", "action": "allow"}]


@needs_bwrap
def test_a_new_host_asks_a_person_and_allowed_once_the_retry_gets_through(site, decider):
    run = make_run(
        turns=[
            {"tool_calls": [call("bash", command=fetch(site))]},
            {"tool_calls": [call("bash", command=fetch(site))]},
            finish_turn(),
        ],
        checks=["grep -q 'hello from the site' page.txt"],
        tool_policy=CURL_ALLOWED,
    )
    run = drive_until_idle(run)
    assert run.status == RunStatus.AWAITING_APPROVAL, run.status_reason
    first = results(run)[0]
    assert "403" in first["output"]  # refused at once: no command waits for a person
    asked = Approval.objects.get(run=run)
    assert (asked.tool_name, asked.tool_input) == (
        "network",
        {"host": HOST, "port": site.port},
    )
    approvals.decide(asked.pk, user=decider, approve=True)
    run = drive_until_idle(run)
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    told = Event.objects.get(run=run, kind="harness.message", payload__reason="network_decision")
    assert "for your next command" in told.payload["text"]
    connections = list(
        Event.objects.filter(run=run, kind="network.connection").values_list("payload", flat=True)
    )
    assert [c["decision"] for c in connections] == ["ask", "allow"]
    assert connections[1]["bytes_down"] > 0 and connections[1]["host"] == HOST


@needs_bwrap
def test_an_allowed_host_needs_no_person_and_a_denied_one_is_not_asked_again(site, decider):
    allowed = make_run(
        turns=[{"tool_calls": [call("bash", command=fetch(site))]}, finish_turn()],
        checks=["grep -q hello page.txt"],
        allowed_hosts=[f"{HOST}:{site.port}"],
        tool_policy=CURL_ALLOWED,
    )
    assert drive_until_idle(allowed).status == RunStatus.SUCCEEDED
    assert not Approval.objects.filter(run=allowed).exists()

    denied = make_run(
        turns=[
            {"tool_calls": [call("bash", command=fetch(site))]},
            {"tool_calls": [call("bash", command=fetch(site))]},
            finish_turn(),
        ],
        tool_policy=CURL_ALLOWED,
    )
    denied = drive_until_idle(denied)
    approvals.decide(
        Approval.objects.get(run=denied).pk, user=decider, approve=False, comment="not needed"
    )
    denied = drive_until_idle(denied)
    assert denied.status == RunStatus.SUCCEEDED  # its checks (true) pass; the fetch never did
    assert Approval.objects.filter(run=denied).count() == 1  # asked once, not again
    decisions = list(
        Event.objects.filter(run=denied, kind="network.connection").values_list(
            "payload__decision", flat=True
        )
    )
    assert decisions == ["ask", "deny"]
    told = Event.objects.get(run=denied, kind="harness.message", payload__reason="network_decision")
    assert "not needed" in told.payload["text"]


@needs_bwrap
def test_allowed_for_the_run_from_the_card_adds_a_rule_for_that_host_only(site, supervisor):
    from tests.helpers import client_for

    run = drive_until_idle(
        make_run(
            turns=[{"tool_calls": [call("bash", command=fetch(site))]}, finish_turn()],
            tool_policy=CURL_ALLOWED,
        )
    )
    asked = Approval.objects.get(run=run)
    card = client_for(supervisor).get("/approvals/").content.decode()
    assert "for the rest of this run" in card and "Edit" not in card
    # The same words as every card, the API and the CLI: approve, with allow_similar.
    client_for(supervisor).post(
        f"/approvals/{asked.pk}/decide",
        {"decision": "approve", "allow_similar": "1"},
        HTTP_HX_REQUEST="true",
    )
    run.refresh_from_db()
    rule = run.tool_policy[0]
    assert (rule["tool"], rule["action"]) == ("network", "allow")
    assert rule["pattern"] == rf"^127\.0\.0\.2:{site.port}$"


def test_allow_host_is_checked(db):
    with pytest.raises(services.RunError, match="not a host name"):
        make_run(turns=[finish_turn()], allowed_hosts=["exa mple.org"])
    with pytest.raises(services.RunError, match="not a port"):
        make_run(turns=[finish_turn()], allowed_hosts=["example.org:99999"])
    run = make_run(turns=[finish_turn()], allowed_hosts=["PyPI.org:443", "files.example"])
    assert [r["note"] for r in run.tool_policy] == [
        "network: connections to pypi.org:443 allowed",
        "network: connections to files.example on any port allowed",
    ]


@needs_bwrap
@pytest.mark.slow
def test_a_run_whose_commands_attack_the_machine_ends_them_and_goes_on(tmp_path):
    """A fork bomb, a 20 GB allocation, a 1 GB output flood and a background process left
    behind, as a run's own commands: each ends, the run goes on to succeed, nothing is left."""
    import time

    from tests.sandboxing import live_processes_with, marker

    mark = marker()
    grab = "x = bytearray(20 * 1024**3)\nprint(len(x))\n"
    turns = [
        {"tool_calls": [call("bash", command="bash -c 'f(){ f | f; }; f'", timeout=5)]},
        {"tool_calls": [call("write_file", path="grab.py", content=grab)]},
        {"tool_calls": [call("bash", command="python3 grab.py")]},
        {"tool_calls": [call("bash", command="head -c 1G /dev/zero")]},
        {"tool_calls": [call("bash", command=f"nohup sleep {mark} > /dev/null 2>&1 &")]},
        {"tool_calls": [call("bash", command="echo still here > alive.txt")]},
        finish_turn(),
    ]
    started = time.monotonic()
    run = drive_until_idle(
        make_run(
            turns=turns,
            checks=["test -f alive.txt"],
            tool_policy=[{"tool": "bash", "action": "allow"}],
            limits={"processes": 64},
        )
    )
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    bomb, _, alloc, flood, background, alive = results(run)[:6]
    assert bomb["data"]["timed_out"] or "process limit" in bomb["output"], bomb
    assert alloc["is_error"], alloc  # MemoryError: it could not have its 20 GB
    assert flood["data"]["truncated"] and len(flood["output"]) < 100_000
    assert not background["is_error"] and alive["data"]["exit_code"] == 0
    assert live_processes_with(f"sleep {mark}") == []  # the background process is gone
    assert time.monotonic() - started < 90  # the machine stayed responsive enough to go on


def test_an_environment_that_would_show_the_data_folder_is_refused(settings):
    from pathlib import Path

    data = Path(settings.DATA_DIR)
    (data / "bin").mkdir(exist_ok=True)
    for folder in (data, Path("/")):
        with pytest.raises(services.RunError, match="data folder"):
            make_run(turns=[finish_turn()], environment=str(folder))
