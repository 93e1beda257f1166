from __future__ import annotations

import json
from pathlib import Path

from django.core.management.base import BaseCommand

from agents import held_out, inputs, suite_guard, test_setup
from agents.management.base import acting, fail
from agents.providers.scripted import ScriptError, load_script
from agents.services import (
    DEMO_GOAL_NOTICE,
    DEMO_SCRIPT_NOTICE,
    Budgets,
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
        parser.add_argument("--max-cost", metavar="USD")
        parser.add_argument("--max-tokens", type=int)
        parser.add_argument("--max-wall-seconds", type=int)
        parser.add_argument("--max-turns-per-session", type=int)
        parser.add_argument(
            "--workspace-from", metavar="DIR", help="copy this folder into the workspace"
        )
        parser.add_argument(
            "--policy", metavar="JSON|FILE", help="tool policy rules (JSON, or a file holding them)"
        )
        parser.add_argument(
            "--webhook",
            action="append",
            default=[],
            metavar="URL",
            help="POST notifications here (repeatable)",
        )
        parser.add_argument(
            "--approval-timeout",
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
            action="append",
            default=[],
            metavar="PATH",
            help="a file or folder the checks depend on (repeatable)",
        )
        parser.add_argument("--protect-action", choices=["deny", "ask"], default="deny")
        parser.add_argument(
            "--criterion",
            action="append",
            default=[],
            metavar="NAME[=CMD]",
            help="an acceptance criterion: passes when CMD does, or when the judge says so",
        )
        parser.add_argument(
            "--allow-host",
            action="append",
            default=[],
            metavar="HOST[:PORT]",
            help="the run's commands may reach this host without asking (repeatable)",
        )
        parser.add_argument("--max-memory-mb", type=int, help="memory per command")
        parser.add_argument("--max-processes", type=int, help="processes per command")
        parser.add_argument("--max-cpu-seconds", type=int, help="CPU seconds per process")
        parser.add_argument(
            "--max-workspace-mb", type=int, help="workspace size, checked at every checkpoint"
        )
        env = parser.add_mutually_exclusive_group()
        env.add_argument(
            "--env",
            metavar="PATH",
            help="an interpreter or virtualenv the run's commands and checks run with",
        )
        env.add_argument(
            "--env-requirements",
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
        rules = None
        if o["policy"]:
            text = o["policy"]
            if not text.lstrip().startswith("["):
                try:
                    text = Path(text).read_text()
                except OSError as e:
                    raise fail(f"--policy: cannot read {o['policy']}: {e.strerror}") from None
            try:
                rules = inputs.load_json(text, what="--policy")
            except inputs.InputError as e:
                raise fail(str(e)) from None
        held = None
        if o["held_out"] or o["held_out_check"]:
            if not o["held_out_check"]:
                raise fail("--held-out needs at least one --held-out-check CMD to run them")
            try:
                held = (
                    held_out.collect(o["held_out"], o["held_out_check"])
                    if o["held_out"]
                    else {"files": {}, "checks": o["held_out_check"]}
                )
            except held_out.HeldOutProblem as e:
                raise fail(f"--held-out: {e}") from None
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
            if o["env"] or o["env_requirements"]:
                setup = None  # the environment named is used as it is
            self.stderr.write(setup.describe() if setup else f"check: {o['checks'][0]}")
        if not o["checks"]:
            raise fail(
                "give at least one --check CMD: the harness runs it to decide when the run is done"
            )
        try:
            run = create_run(
                goal=o["goal"],
                checks=o["checks"],
                provider=o["provider"],
                script=script,
                script_name=o["script"] or "",
                model=o["model"],
                budgets=Budgets(
                    max_sessions=o["max_sessions"],
                    max_tokens=o["max_tokens"],
                    max_cost_usd=o["max_cost"],
                    max_wall_seconds=o["max_wall_seconds"],
                ),
                max_turns_per_session=o["max_turns_per_session"],
                workspace_from=o["workspace_from"],
                tool_policy=rules,
                rubric=o["rubric"],
                judge_model=o["judge_model"],
                protected_paths=o["protect"],
                protected_action=o["protect_action"],
                acceptance=o["criterion"],
                webhook_urls=o["webhook"],
                allowed_hosts=o["allow_host"],
                limits={
                    "memory_mb": o["max_memory_mb"],
                    "processes": o["max_processes"],
                    "cpu_seconds": o["max_cpu_seconds"],
                    "workspace_mb": o["max_workspace_mb"],
                },
                environment=o["env"],
                requirements=o["env_requirements"],
                approval_timeout_seconds=o["approval_timeout"],
                heartbeat_seconds=o["heartbeat_seconds"],
                project=o["project"],
                fleet_conflicts=o["fleet_conflicts"],
                suite_guard=not o["no_suite_guard"],
                held_out=held,
                protect_tests=not o["no_protect_tests"],
                **({"test_setup": setup.as_dict()} if setup is not None else {}),
                created_by=user,
            )
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
