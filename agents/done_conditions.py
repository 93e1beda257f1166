"""Done-conditions: shell checks the harness runs itself, never taking the model's word."""

from __future__ import annotations

import errno
import re
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from agents import sandbox, suite_guard
from agents.models import Event, Run


class NoRoomForChecks(OSError):
    """A check was stopped because the disk's free space fell below what is kept for the
    database: the host's state, not a verdict on the work. The run pauses for space (as for any
    full disk) and the checks run again when it is resumed (found by bench/chaos.py: a run
    failed its `true` while the disk was full, and its agent was sent back to finished work)."""

    def __init__(self, command: str, where: str) -> None:
        super().__init__(
            errno.ENOSPC,
            f"the disk's free space fell below what is kept for the database while the check "
            f"`{command}` ran",
            where,
        )


def run_checks(
    commands: list[str],
    workspace: sandbox.Workspace,
    *,
    should_stop: Callable[[], bool] | None = None,
    timeout: float = 600.0,
    output_limit: int = 30_000,
    isolation: str | None = None,
    limits: sandbox.Limits | None = None,
    toolchain: list[str] | None = None,
    guard: bool = False,
    baseline: dict[str, dict[str, Any] | None] | None = None,
) -> list[dict[str, Any]]:
    """Run each check as the harness, in the same sandbox as the agent's commands and never
    with more reach (no network at all; the run's limits and toolchain).

    With `guard`, a check that runs a test suite (agents/suite_guard.py) runs with the guarded
    environment, and passes only when the runner left a result the harness can read that holds
    up against `baseline` ({command: counts at the run's start})."""
    results = []
    for command in commands:
        kind = suite_guard.suite_kind(command) if guard else None
        report_dir = tempfile.mkdtemp(prefix="shiftlog-check-") if kind else None
        try:
            r = sandbox.run_command(
                command,
                workspace=workspace,
                timeout=timeout,
                output_limit=output_limit,
                should_stop=should_stop,
                isolation=isolation,
                limits=limits,
                toolchain=toolchain,
                extra_env=suite_guard.check_env(
                    kind,
                    report_dir,
                    toolchain,
                    safe_path=not suite_guard.flat_layout(workspace.path),
                )
                if kind
                else None,
                writable=[report_dir] if report_dir else (),
            )
            if "disk_free" in r.exceeded:
                raise NoRoomForChecks(command, str(workspace.path))
            result = {
                "command": command,
                "exit_code": r.exit_code,
                "passed": r.exit_code == 0 and not r.timed_out and not r.cancelled,
                "timed_out": r.timed_out,
                "cancelled": r.cancelled,
                "output": r.output,
                "duration_ms": round(r.duration_ms, 1),
                "isolation": r.isolation,
            }
            if kind and not (r.timed_out or r.cancelled):
                counts = suite_guard.read_result(kind, report_dir, r.output)
                problems = suite_guard.compare(counts, (baseline or {}).get(command))
                result["suite"] = counts
                result["suite_problems"] = problems
                result["output"] += (
                    f"\n[shiftlog] the test runner counted: {suite_guard.describe(counts)}"
                )
                if baseline and baseline.get(command):
                    start = suite_guard.describe(baseline[command])
                    result["output"] += f" (at the run's start: {start})"
                if problems:
                    result["passed"] = False
                    result["output"] += "\n[shiftlog] not passed: " + "; ".join(problems)
        finally:
            if report_dir:
                shutil.rmtree(report_dir, ignore_errors=True)
        results.append(result)
        if r.cancelled:
            break
    return results


def fenced(text: str) -> str:
    """Raw output as a Markdown code block: shown as it was (no reflowed tracebacks, no `---`
    turned into a rule), with a fence longer than any run of backticks inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text.rstrip()}\n{fence}"


def summary(results: list[dict[str, Any]]) -> str:
    if not results:
        return "This run has no done-conditions, so the harness cannot confirm it is done."
    passed = sum(r["passed"] for r in results)
    lines = [f"The harness ran the done-conditions: {passed} of {len(results)} passed."]
    for r in results:
        if r["passed"]:
            lines.append(f"- PASSED `{r['command']}`")
            continue
        state = "timed out" if r["timed_out"] else f"exit code {r['exit_code']}"
        lines.append(f"- FAILED `{r['command']}` ({state}):\n\n{fenced(r['output'][-4000:])}\n")
    if passed < len(results):
        lines.append("The run is not done. Fix what fails, then call finish again.")
    return "\n".join(lines)


def latest(run_id: int, run: Run | None = None) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each check's latest result on the live branch, {command: (seq, payload)}, in the order
    the checks were last run. Read newest first, stopping once every check the run has now
    (its done-conditions and acceptance checks) is found: a session change reads a few rows,
    not every result of a long run. `run`: the run, when the caller has just read it."""
    ranges = None
    if run is not None:
        row = (run.checks, run.acceptance)
        ranges = Event.objects.ranges_of(run)
    else:
        row = Run.objects.filter(pk=run_id).values_list("checks", "acceptance").first()
    wanted = set()
    if row is not None:
        wanted = set(row[0] or []) | {c["check"] for c in row[1] or [] if c.get("check")}
    found: dict[str, tuple[int, dict[str, Any]]] = {}
    newest_first = (
        Event.objects.check_results(run_id, ranges).order_by("-seq").values_list("seq", "payload")
    )
    for seq, payload in newest_first.iterator(chunk_size=32):
        found.setdefault(payload["command"], (seq, payload))
        if wanted and wanted <= found.keys():
            break
    return dict(sorted(found.items(), key=lambda item: item[1][0]))


def latest_results(run_id: int, run: Run | None = None) -> list[dict[str, Any]]:
    """The most recent result of each check, in the order the checks were last run: what a new
    session is told."""
    return [payload for _, payload in latest(run_id, run).values()]


def reading(run_id: int, run: Run | None = None) -> dict[str, dict[str, Any]]:
    """The ratchet's reading, kept on every checkpoint: each check's latest result in brief."""
    return {
        command: {
            "passed": payload["passed"],
            "exit_code": payload.get("exit_code"),
            "seq": seq,
            "at": payload.get("at", "finish"),
        }
        for command, (seq, payload) in latest(run_id, run).items()
    }
