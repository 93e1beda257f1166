"""`shiftlog-claude`: a real Claude Code session under Shiftlog, in any repository.

Run in a repository, it creates an external run (or attaches to one with `--run`), uploads the
folder and drives Claude Code (`claude -p`) session by session. Claude Code's hooks, installed
through `--settings` with `--setting-sources user` (the repository's own `.claude/` settings
cannot switch them off), call back into this module (`shiftlog-claude hook STATE`):

- PreToolUse asks Shiftlog about every tool call (with Claude Code's tool_use_id as the call's
  id and the repository as the agent's root) and waits while a person decides; allow returns
  the input to run (a person's edit) and their note, deny the reason. A hook that fails or
  times out blocks the call (`onFailure: block`): nothing runs unasked.
- PostToolUse / PostToolUseFailure report what the tool did, and the usage the transcript shows
  is posted as turns, so budgets and costs are real.
- Stop uploads the folder and calls `finish`: the harness runs the checks; failing checks are
  sent back as the reason to go on, passing checks end the run `succeeded`.
- A paused, cancelled or budget-stopped run, or a rewind, ends the session at the next hook
  (`continue: false`) and says why. After a rewind the folder is restored from the checkpoint
  before the next session, and the next session's first message says so.

The token never reaches Claude Code's environment (nor its Bash tool's): the hooks read it from
a state file in a private folder outside the repository.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ._client import Client
from ._errors import Conflict, Rewound, ShiftlogError

STOPPED = frozenset({"paused", "cancelled", "failed", "succeeded"})
PRE_TOOL_TIMEOUT = 24 * 3600  # seconds a PreToolUse hook may wait for a person
POLL_WAIT = 50.0
REWIND_WAIT = 300.0  # seconds the driver waits for a rewind under way (the run is paused)
OUTPUT_LIMIT = 200_000
# What is never uploaded: version control's own folder and caches.
SKIP = frozenset({".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".venv", "node_modules"})


# --- state shared with the hooks ----------------------------------------------------------------
class State:
    """A JSON file (mode 0600, in a private folder) the driver writes and the hooks read and
    update under a lock: where Shiftlog is, the token, the run, the folder, the usage posted."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def locked(self):
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = json.loads(self.path.read_text())
            yield data
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            os.chmod(tmp, 0o600)
            tmp.replace(self.path)

    def read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())


def _client(state: dict[str, Any]) -> Client:
    return Client(state["url"], state["token"], agent=state["agent"], timeout=30.0)


# --- the hooks ----------------------------------------------------------------------------------
def _stop(reason: str, state: dict[str, Any] | None = None, **flags: Any) -> dict[str, Any]:
    """End the session: `continue: false` (and, from PreToolUse, a denial: the call never
    runs). The driver also ends Claude Code when it sees the reason in the state file, so the
    session ends even where Claude Code goes on after `continue: false`."""
    if state is not None:
        with State(Path(state["_path"])).locked() as data:
            data["stop"] = reason
            data.update(flags)
    return {"continue": False, "stopReason": reason, "systemMessage": reason}


def _stop_call(reason: str, state: dict[str, Any], **flags: Any) -> dict[str, Any]:
    return {
        **_stop(reason, state, **flags),
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        },
    }


def _why_rewound(rewind: dict[str, Any]) -> str:
    return (
        f"Shiftlog: the run was rewound to checkpoint {rewind.get('checkpoint')} by "
        f"{rewind.get('by')}; the session ends and the next starts from there"
    )


def _why_stopped(client: Client, run_id: int, status: str, reason: str = "") -> str:
    if status == "paused":
        # Paused for a rewind under way: say so (the next session starts from the checkpoint).
        with contextlib.suppress(ShiftlogError):
            if client.get_run(run_id).pause_cause == "rewind":
                return (
                    "Shiftlog: a person is rewinding the run to an earlier checkpoint; the "
                    "session ends and the next starts from there"
                )
    return f"Shiftlog: the run is {status.replace('_', ' ')}" + (f" ({reason})" if reason else "")


def _pre_tool(client: Client, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    run_id = state["run"]
    decision = client.request_tool_call(
        run_id,
        str(event.get("tool_name", "")),
        event.get("tool_input") or {},
        call_id=event.get("tool_use_id") or None,
        root=state["root"],
    )
    while decision.pending:
        if decision.run_status in STOPPED:
            # Paused or cancelled while a person had not decided: the call is taken back (it
            # leaves the inbox) and the session ends; a new one starts when the run resumes.
            with contextlib.suppress(ShiftlogError):
                client.withdraw_tool_call(decision.id)
            return _stop_call(_why_stopped(client, run_id, decision.run_status), state)
        client.heartbeat(run_id)
        decision = client.get_tool_call(decision.id, wait=POLL_WAIT)
    if decision.rewound:
        return _stop_call(_why_rewound(decision.rewound), state, rewound=True)
    if decision.allowed:
        out: dict[str, Any] = {"hookEventName": "PreToolUse", "permissionDecision": "allow"}
        if decision.input is not None and decision.input != event.get("tool_input"):
            out["updatedInput"] = decision.input
        if decision.note:
            # The model's history keeps the call as it asked for it: say what ran instead.
            out["additionalContext"] = f"Shiftlog: {decision.note}"
        out["permissionDecisionReason"] = decision.reason or "allowed by Shiftlog"
        return {"hookSpecificOutput": out}
    if decision.run_status in STOPPED:  # paused, cancelled, a budget: the session ends
        return _stop_call(_why_stopped(client, run_id, decision.run_status, decision.reason), state)
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": f"Shiftlog refused this call: {decision.reason}",
        }
    }


def _post_tool(client: Client, state: dict[str, Any], event: dict[str, Any], failed: bool):
    call_id = event.get("tool_use_id")
    if failed:
        output, is_error = str(event.get("error") or "the tool failed"), True
    else:
        response = event.get("tool_response")
        output = response if isinstance(response, str) else json.dumps(response)
        is_error = False
    status = ""
    if call_id:
        try:
            ack = client.report_tool_result(call_id, output[:OUTPUT_LIMIT], is_error)
            status = ack.run_status
        except ShiftlogError as e:
            status = ""
            print(f"shiftlog-claude: the result was not recorded: {e}", file=sys.stderr)
    return status


def _sync_usage(client: Client, state_file: State, transcript: str | None) -> str:
    """Post each assistant message of the transcript not posted yet as a turn (its usage)."""
    if not transcript or not os.path.exists(transcript):
        return ""
    status = ""
    with state_file.locked() as state:
        posted = set(state.get("posted", []))
        messages: dict[str, dict[str, Any]] = {}
        with open(transcript, encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                except ValueError:
                    continue
                message = entry.get("message") if entry.get("type") == "assistant" else None
                if isinstance(message, dict) and message.get("id") and message.get("usage"):
                    known = messages.setdefault(message["id"], {**message, "content": []})
                    known["content"] += [
                        b for b in message.get("content") or [] if isinstance(b, dict)
                    ]
                    known["usage"] = message["usage"]
        for message_id, message in messages.items():
            if message_id in posted:
                continue
            usage = message.get("usage") or {}
            text = "\n".join(
                b.get("text", "") for b in message["content"] if b.get("type") == "text"
            ).strip()
            try:
                turn = client.record_turn(
                    state["run"],
                    text=text[:200_000],
                    model=str(message.get("model") or ""),
                    input_tokens=int(usage.get("input_tokens") or 0),
                    output_tokens=int(usage.get("output_tokens") or 0),
                    cache_read_tokens=int(usage.get("cache_read_input_tokens") or 0),
                    cache_write_tokens=int(usage.get("cache_creation_input_tokens") or 0),
                )
            except ShiftlogError as e:  # paused or rewound meanwhile: posted when it can be
                print(f"shiftlog-claude: a turn was not recorded: {e}", file=sys.stderr)
                break
            status = turn.run_status
            posted.add(message_id)
        state["posted"] = sorted(posted)
        state["transcript"] = transcript
    return status


def _on_stop(client: Client, state: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    """Claude Code says it is done: the harness's checks decide."""
    run_id = state["run"]
    upload(client, run_id, Path(state["root"]))
    summary = str(event.get("last_assistant_message") or "").strip() or "done"
    result = client.finish(run_id, summary[:50_000])
    if result.passed:
        return {"systemMessage": "Shiftlog: the harness's checks pass; the run succeeded"}
    if result.run_status in STOPPED:
        return _stop(_why_stopped(client, run_id, result.run_status), state)
    failing = [c for c in result.checks if not c.passed]
    lines = [
        f"- `{c.command}` failed (exit {c.exit_code}): {str(c.output or '')[-1500:]}"
        for c in failing
    ]
    return {
        "decision": "block",
        "reason": "Shiftlog ran the done-checks on your work and they do not pass yet; you are "
        "not done. Fix this and finish again:\n" + "\n".join(lines or [result.summary]),
    }


def hook(state_path: str) -> int:
    """One hook call of Claude Code: its event on stdin, the answer on stdout."""
    state_file = State(Path(state_path))
    event = json.loads(sys.stdin.read() or "{}")
    name = event.get("hook_event_name", "")
    state = {**state_file.read(), "_path": state_path}
    try:
        with _client(state) as client:
            if name == "PreToolUse":
                answer = _pre_tool(client, state, event)
            elif name in ("PostToolUse", "PostToolUseFailure"):
                status = _post_tool(client, state, event, name == "PostToolUseFailure")
                status = _sync_usage(client, state_file, event.get("transcript_path")) or status
                answer = (
                    _stop(_why_stopped(client, state["run"], status), state)
                    if status in STOPPED
                    else {}
                )
            elif name == "Stop":
                status = _sync_usage(client, state_file, event.get("transcript_path"))
                answer = (
                    _stop(_why_stopped(client, state["run"], status), state)
                    if status in STOPPED
                    else _on_stop(client, state, event)
                )
            else:
                answer = {}
    except Rewound as e:  # the work since the rewind is undone: this session ends here
        stop = _stop_call if name == "PreToolUse" else _stop
        answer = stop(_why_rewound(e.rewound), state, rewound=True)
    except Exception as e:  # never let a call through on a failure: block it and say why
        print(f"shiftlog-claude: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(answer))
    return 0


# --- the workspace ------------------------------------------------------------------------------
def upload(client: Client, run_id: int, folder: Path) -> None:
    client.upload_workspace(run_id, folder)


def restore(client: Client, run_id: int, number: int, folder: Path) -> None:
    """Put the folder back as it was at checkpoint `number` (a person's rewind)."""
    with tempfile.TemporaryDirectory() as tmp:
        archive = Path(tmp) / "checkpoint.tar.gz"
        client.export_checkpoint(run_id, number, archive)
        staging = Path(tmp) / "files"
        staging.mkdir()
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(staging, filter="data")
        inner = [p for p in staging.iterdir()]
        source = inner[0] if len(inner) == 1 and inner[0].is_dir() else staging
        for path in list(folder.iterdir()):
            if path.name in SKIP:
                continue
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        for path in source.iterdir():
            shutil.move(str(path), folder / path.name)


# --- the driver ---------------------------------------------------------------------------------
def settings_for(state_path: Path) -> dict[str, Any]:
    command = f"{sys.executable} -m shiftlog_client.claude hook {state_path}"

    def entry(timeout: int) -> list[dict[str, Any]]:
        return [
            {
                "matcher": "*",
                "hooks": [
                    {
                        "type": "command",
                        "command": command,
                        "timeout": timeout,
                        "onFailure": "block",
                    }
                ],
            }
        ]

    return {
        "hooks": {
            "PreToolUse": entry(PRE_TOOL_TIMEOUT),
            "PostToolUse": entry(120),
            "PostToolUseFailure": entry(120),
            "Stop": entry(3600),
        },
        # The agent's Bash gets none of Shiftlog's variables (the token is not in them anyway).
        "env": {"SHIFTLOG_TOKEN": "", "SHIFTLOG_URL": ""},
    }


def _spec(args: argparse.Namespace) -> dict[str, Any]:
    spec: dict[str, Any] = {"checks": args.check, "provider": "external"}
    for key in ("max_sessions", "max_tokens", "max_cost_usd", "max_wall_seconds"):
        if getattr(args, key) is not None:
            spec[key] = getattr(args, key)
    if args.protect:
        spec["protected_paths"] = args.protect
    if args.policy:
        spec["tool_policy"] = json.loads(Path(args.policy).read_text())
    if args.allow_host:
        spec["allowed_hosts"] = args.allow_host
    return spec


def drive(args: argparse.Namespace) -> int:
    url = args.url or os.environ.get("SHIFTLOG_URL", "")
    token = os.environ.get("SHIFTLOG_TOKEN", "")
    if not url or not token:
        print("shiftlog-claude: set SHIFTLOG_URL and SHIFTLOG_TOKEN", file=sys.stderr)
        return 2
    root = Path(args.dir).resolve()
    agent = args.agent or f"claude-code-{uuid.uuid4().hex[:8]}"
    with Client(url, token, agent=agent) as client:
        if args.run:
            run_id = int(args.run)
        else:
            if not args.goal or not args.check:
                print("shiftlog-claude: give --goal and --check (or --run ID)", file=sys.stderr)
                return 2
            run_id = client.create_run(args.goal, **_spec(args)).id
            print(f"shiftlog-claude: run {run_id}", file=sys.stderr, flush=True)
        try:
            # Not sent over a rewind the agent missed: the first context restores the folder.
            with contextlib.suppress(Rewound):
                upload(client, run_id, root)
        except Conflict:
            if not _ended(client, run_id):
                raise
            return _report(client, run_id)
        with hooked(url, token, run_id, root, agent=agent) as (settings, state):
            return _sessions(client, args, run_id, root, state, settings)


def _ended(client: Client, run_id: int) -> bool:
    """The run is in no state for its agent to go on (a refusal that says so): it ended, or a
    person paused it; a rewind under way is waited out first. A run resumed whose checks had
    passed before the pause is marked succeeded at the agent's first call."""
    return _settled(client, run_id).status in STOPPED


def _report(client: Client, run_id: int) -> int:
    run = client.get_run(run_id)
    why = f" ({run.status_reason})" if run.status_reason else ""
    print(f"shiftlog-claude: run {run_id} is {run.status}{why}", file=sys.stderr)
    return 0 if run.status == "succeeded" else 1


@contextlib.contextmanager
def hooked(url: str, token: str, run_id: int, root: Path, *, agent: str):
    """Claude Code's settings file that installs Shiftlog's hooks for this run and folder
    (pass it with `--settings FILE --setting-sources user`, or the Agent SDK's `settings`), and
    the hooks' state: both in a private folder (the token is in the state file, mode 0600,
    never in Claude Code's environment), removed afterwards. Yields (settings path, State)."""
    private = Path(tempfile.mkdtemp(prefix="shiftlog-claude-"))
    try:
        state_path = private / "state.json"
        state_path.write_text(
            json.dumps(
                {"url": url, "token": token, "agent": agent, "run": run_id, "root": str(root)}
            )
        )
        os.chmod(state_path, 0o600)
        settings = private / "settings.json"
        settings.write_text(json.dumps(settings_for(state_path)))
        yield settings, State(state_path)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _watch(proc: subprocess.Popen, state: State) -> str:
    """Wait for Claude Code; end it when a hook said the session is over (a pause, a cancel,
    a rewind). Its output (the `-p` result as JSON)."""
    chunks: list[str] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read()), daemon=True)
    reader.start()
    stopped_at = None
    while proc.poll() is None:
        time.sleep(0.2)
        if stopped_at is None and state.read().get("stop"):
            stopped_at = time.monotonic()
            proc.send_signal(signal.SIGINT)
        elif stopped_at is not None and time.monotonic() - stopped_at > 10:
            proc.kill()
    reader.join(timeout=5)
    return "".join(chunks)


def _settled(client: Client, run_id: int):
    """The run, once a rewind under way is over: a rewind pauses the run while it restores the
    workspace, and the agent goes on from the checkpoint, not from a pause."""
    deadline = time.monotonic() + REWIND_WAIT
    run = client.get_run(run_id)
    while run.status == "paused" and run.pause_cause == "rewind" and time.monotonic() < deadline:
        time.sleep(0.2)
        run = client.get_run(run_id)
    return run


def _sessions(
    client: Client,
    args: argparse.Namespace,
    run_id: int,
    root: Path,
    state: State,
    settings: Path,
) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHIFTLOG_")}
    for _ in range(args.max_claude_sessions):
        try:
            context = client.run_context(run_id)
        except Conflict:
            if _ended(client, run_id):
                break
            context = client.run_context(run_id)  # a rewind was under way; it is over
        rewind = context.raw.get("rewound")
        if rewind:  # a person rewound the run: the folder goes back to that checkpoint
            restore(client, run_id, int(rewind["checkpoint"]), root)
        if context.run_status in STOPPED:
            break
        print(f"shiftlog-claude: session {context.session}", file=sys.stderr, flush=True)
        with state.locked() as data:
            data.pop("stop", None)
        proc = subprocess.Popen(
            [
                args.claude,
                "-p",
                context.first_message,
                "--settings",
                str(settings),
                "--setting-sources",
                "user",
                "--output-format",
                "json",
                *args.claude_args,
            ],
            cwd=root,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        out = _watch(proc, state)
        result: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            result = json.loads(out or "{}")
        _sync_usage(client, state, state.read().get("transcript"))
        status = _settled(client, run_id).status
        if status in STOPPED:
            break
        with state.locked() as data:
            rewound = data.pop("rewound", False)
            stop = data.pop("stop", "")
        if stop:
            print(f"shiftlog-claude: {stop}", file=sys.stderr, flush=True)
        if rewound:
            continue  # the next session starts from the checkpoint, not from a handoff
        # The context window ended without the checks passing: hand off to a new session.
        last = str(result.get("result") or "").strip()
        try:  # rewound meanwhile: the folder is not uploaded over it; the next loop restores it
            upload(client, run_id, root)
        except Rewound:
            continue
        try:
            client.handoff(run_id, (last or "the session ended before the checks passed")[:50_000])
        except Rewound:
            continue
        except ShiftlogError as e:
            print(f"shiftlog-claude: the handoff was not recorded: {e}", file=sys.stderr)
    return _report(client, run_id)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["hook"]:
        return hook(argv[1])
    parser = argparse.ArgumentParser(
        prog="shiftlog-claude", description="Run Claude Code in this folder under Shiftlog."
    )
    parser.add_argument("--goal")
    parser.add_argument("--check", action="append", default=[], help="a done-check (repeat)")
    parser.add_argument("--run", help="attach to this external run instead of creating one")
    parser.add_argument("--protect", action="append", default=[], help="a protected path")
    parser.add_argument("--policy", help="a JSON file with the run's tool policy")
    parser.add_argument("--allow-host", action="append", default=[])
    parser.add_argument("--max-sessions", type=int)
    parser.add_argument("--max-tokens", type=int)
    parser.add_argument("--max-cost-usd")
    parser.add_argument("--max-wall-seconds", type=int)
    parser.add_argument("--dir", default=".", help="the repository (default: here)")
    parser.add_argument("--url", help="Shiftlog's address (default: $SHIFTLOG_URL)")
    parser.add_argument("--agent", help="this agent's id in the run's log")
    parser.add_argument("--claude", default=shutil.which("claude") or "claude")
    parser.add_argument("--max-claude-sessions", type=int, default=20)
    parser.add_argument("claude_args", nargs="*", help="after --: more arguments for claude")
    return drive(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
