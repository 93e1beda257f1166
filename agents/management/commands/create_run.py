from __future__ import annotations

import json
from pathlib import Path

from agents import held_out, inputs, suite_guard, test_setup
from agents.management.base import BaseCommand, acting, fail
from agents.providers.scripted import ScriptError, load_script
from agents.runspec import RunSpec
from agents.services import (
    DEMO_GOAL_NOTICE,
    DEMO_SCRIPT_NOTICE,
    RunError,
    create_run,
    is_demo_goal,
)


class Command(BaseCommand):
    help = "Create a run and queue it. Prints the new run's id (a JSON object with --json)."

    def add_arguments(self, parser):
        parser.add_argument("--goal", required=True, help="what the agent should achieve")
        parser.add_argument(
            "--check",
            action="append",
            dest="checks",
            default=[],
            metavar="CMD",
            help="a done-condition: a shell command that exits 0 when the goal is met (repeatable); "
            "with --workspace-from and none given, the project's test suite as its CI runs it",
        )
        parser.add_argument(
            "--held-out",
            metavar="DIR",
            help="files the agent never sees (tests, say), written in only for --held-out-check",
        )
        parser.add_argument(
            "--held-out-check",
            action="append",
            default=[],
            metavar="CMD",
            help="a check run only at finish, with the --held-out files in place (repeatable)",
        )
        parser.add_argument(
            "--no-suite-guard",
            action="store_true",
            help="run test-suite checks unguarded and uncounted (see docs/security.md)",
        )
        parser.add_argument(
            "--no-protect-tests",
            action="store_true",
            help="with a test-suite check, do not protect the workspace's tests by default",
        )
        parser.add_argument(
            "--provider",
            choices=["scripted", "anthropic", "external"],
            default="scripted",
            help="external: an agent outside Shiftlog drives the run through the API",
        )
        parser.add_argument(
            "--heartbeat-seconds",
            type=int,
            metavar="S",
            help="external runs: silent this long, the run shows as stalled (default 300)",
        )
        parser.add_argument(
            "--script", metavar="FILE", help="script for the scripted provider (JSON)"
        )
        parser.add_argument("--model", help="model name (anthropic: default claude-sonnet-4-5)")
        parser.add_argument("--max-sessions", type=int)
        parser.add_argument("--max-cost", dest="max_cost_usd", metavar="USD")
        parser.add_argument("--max-tokens", type=int)
        parser.add_argument("--max-wall-seconds", type=int)
        parser.add_argument("--max-turns-per-session", type=int)
        parser.add_argument(
            "--max-input-tokens-per-session",
            type=int,
            metavar="N",
            help="a session hands off when its latest request is this large",
        )
        parser.add_argument(
            "--workspace-from", metavar="DIR", help="copy this folder into the workspace"
        )
        parser.add_argument(
            "--policy",
            dest="tool_policy",
            metavar="JSON|FILE",
            help="tool policy rules (JSON, or a file holding them)",
        )
        parser.add_argument(
            "--webhook",
            dest="webhook_urls",
            action="append",
            default=[],
            metavar="URL",
            help="POST notifications here (repeatable)",
        )
        parser.add_argument(
            "--slack-channel",
            metavar="C…|#NAME",
            help="post this run's Slack messages here (default: its project's channel)",
        )
        parser.add_argument(
            "--slack-news",
            metavar="KINDS",
            help="which run news goes to Slack: any of ended,paused,budget, or off "
            "(default: the project's settings)",
        )
        parser.add_argument(
            "--approval-timeout",
            dest="approval_timeout_seconds",
            type=int,
            metavar="SECONDS",
            help="waiting approvals expire (count as denied) after this",
        )
        parser.add_argument(
            "--rubric", default="", help="criteria for the independent judge, one a line"
        )
        parser.add_argument(
            "--judge-model", default="", help="the judge's model (default: the run's)"
        )
        parser.add_argument(
            "--protect",
            dest="protected_paths",
            action="append",
            default=[],
            metavar="PATH",
            help="a file or folder the checks depend on (repeatable)",
        )
        parser.add_argument(
            "--protect-action", dest="protected_action", choices=["deny", "ask"], default="deny"
        )
        parser.add_argument(
            "--criterion",
            dest="acceptance",
            action="append",
            default=[],
            metavar="NAME[=CMD]",
            help="an acceptance criterion: passes when CMD does, or when the judge says so",
        )
        parser.add_argument(
            "--allow-host",
            dest="allowed_hosts",
            action="append",
            default=[],
            metavar="HOST[:PORT]",
            help="the run's commands may reach this host without asking (repeatable)",
        )
        parser.add_argument("--max-memory-mb", type=int, help="memory per command")
        parser.add_argument("--max-processes", type=int, help="processes per command")
        parser.add_argument("--max-cpu-seconds", type=int, help="CPU seconds per process")
        parser.add_argument(
            "--max-workspace-mb",
            type=int,
            help="workspace size (MB): a command growing it past this is stopped, and a checkpoint over it pauses the run",
        )
        env = parser.add_mutually_exclusive_group()
        env.add_argument(
            "--env",
            dest="environment",
            metavar="PATH",
            help="an interpreter or virtualenv the run's commands and checks run with",
        )
        env.add_argument(
            "--env-requirements",
            dest="requirements",
            metavar="FILE",
            help="build a virtualenv with these requirements for the commands and checks",
        )
        parser.add_argument(
            "--fleet-conflicts",
            choices=["agent", "person"],
            default="agent",
            help="a merge conflict of a child run's work goes to the agent, or to a person",
        )
        parser.add_argument(
            "--project",
            default="",
            help="a project name: runs of one project share its memory (see `memory`)",
        )
        parser.add_argument("--user", help="the run's owner (recorded in the log)")
        parser.add_argument("--json", action="store_true")

    def handle(self, *args, **o):
        user, _ = acting(o["user"])
        script = None
        if o["script"]:
            if o["provider"] != "scripted":
                raise fail("--script is only for --provider scripted")
            try:
                script = load_script(o["script"])
            except ScriptError as e:
                raise fail(str(e)) from None
        if o["tool_policy"]:
            o["tool_policy"] = _policy(o["tool_policy"])
        held = _held_out(o)
        setup = None
        if (
            o["workspace_from"]
            and test_setup.is_python_project(o["workspace_from"])
            and (not o["checks"] or any(suite_guard.suite_kind(c) for c in o["checks"]))
        ):
            try:
                setup = test_setup.detect(o["workspace_from"])
            except test_setup.SetupProblem as e:
                raise fail(f"--workspace-from: {e}") from None
            if not o["checks"]:
                o["checks"] = [setup.command]
            if o["environment"] or o["requirements"]:
                setup = None  # the environment named is used as it is
            self.stderr.write(setup.describe() if setup else f"check: {o['checks'][0]}")
        if not o["checks"]:
            raise fail(
                "give at least one --check CMD: the harness runs it to decide when the run is done"
            )
        # The options are named as RunSpec's fields are (agents/runspec.py).
        spec = RunSpec.build(
            o,
            script=script,
            script_name=o["script"] or "",
            suite_guard=not o["no_suite_guard"],
            protect_tests=not o["no_protect_tests"],
            held_out=held,
            test_setup=setup.as_dict() if setup is not None else None,
        )
        try:
            run = create_run(spec, created_by=user)
        except RunError as e:
            raise fail(str(e)) from None
        if run.provider == "scripted" and script is None:
            # Not silently: a goal of one's own with the demo's script does the demo's task.
            if is_demo_goal(o["goal"]):
                self.stderr.write(f"no --script given: {DEMO_GOAL_NOTICE}")
            else:
                self.stderr.write(
                    f"no --script given: {DEMO_SCRIPT_NOTICE} "
                    "Give --script FILE to have it play your own."
                )
        if o["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "id": run.pk,
                        "status": run.status,
                        "workspace": str(run.workspace_path),
                        "limits": run.limits,
                        "toolchain": run.toolchain,
                    }
                )
            )
        else:
            self.stdout.write(str(run.pk))


def _policy(text: str) -> list:
    """--policy: JSON rules, or a file holding them."""
    given = text
    if not text.lstrip().startswith("["):
        try:
            text = Path(text).read_text()
        except OSError as e:
            raise fail(f"--policy: cannot read {given}: {e.strerror}") from None
    try:
        return inputs.load_json(text, what="--policy")
    except inputs.InputError as e:
        raise fail(str(e)) from None


def _held_out(o: dict) -> dict | None:
    """--held-out DIR and --held-out-check CMD: files and checks the agent never sees."""
    if not (o["held_out"] or o["held_out_check"]):
        return None
    if not o["held_out_check"]:
        raise fail("--held-out needs at least one --held-out-check CMD to run them")
    try:
        if o["held_out"]:
            return held_out.collect(o["held_out"], o["held_out_check"])
        return {"files": {}, "checks": o["held_out_check"]}
    except held_out.HeldOutProblem as e:
        raise fail(f"--held-out: {e}") from None
