"""`shiftlog-mcp`: an MCP server (stdio) that puts any MCP-capable agent under a Shiftlog run.

It speaks for one external run (`SHIFTLOG_RUN` or `--run`) of the Shiftlog at `SHIFTLOG_URL`,
with the agent's token (`SHIFTLOG_TOKEN`, from the environment only: never on a command line),
and offers the agent these tools:

- `approve(tool_name, input, tool_use_id)`: ask Shiftlog before a tool call; the run's policy
  decides, or a person in the approval inbox (the tool waits for them). It answers Claude Code's
  `--permission-prompt-tool` contract: a JSON text `{"behavior": "allow", "updatedInput": …}`
  (the input to run, as a person may have edited it) or `{"behavior": "deny", "message": …}`.
  Any failure (Shiftlog unreachable, a bad token) is a deny that says why: nothing runs unasked.
- `remember(key, text)` / `recall(query)`: the run's memory (and its project's).
- `handoff(summary, …)`: end the session with a handoff the next session starts from.
- `checkpoint(label)`: a checkpoint a person can rewind to.
- `finish(summary)`: claim done; the harness runs the run's checks itself and answers whether
  they pass and, if not, what failed.

With `SHIFTLOG_DIR` (or `--dir`), the agent's folder: absolute paths under it are read as paths
in the run's workspace, and `checkpoint`, `handoff` and `finish` upload it first, so the harness
checks (and a person rewinds to) the files the agent has.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from ._async_client import AsyncClient
from ._base import TRANSPORT_ERRORS
from ._errors import NotFound, ShiftlogError, Unauthorized
from ._models import STOPPED_STATUSES, ToolDecision

try:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from pydantic import Field
except ImportError:  # pragma: no cover - said plainly by main()
    MCPServer = None  # type: ignore[assignment,misc]

POLL_WAIT = 50.0  # seconds each long-poll for a person's decision waits
RECALL_LIMIT = 50
DEFAULT_AGENT = "shiftlog-mcp"


@dataclass(frozen=True)
class Config:
    url: str
    token: str
    run: int
    agent: str = DEFAULT_AGENT
    folder: Path | None = None

    def client(self) -> AsyncClient:
        return AsyncClient(self.url, self.token, agent=self.agent, timeout=30.0)


def _why(config: Config, error: Exception) -> str:
    """A Shiftlog error as one plain sentence for the agent (and the person reading its log)."""
    if isinstance(error, TRANSPORT_ERRORS):
        return f"cannot reach Shiftlog at {config.url}: {type(error).__name__}: {error}"
    if isinstance(error, Unauthorized):
        return (
            "Shiftlog does not accept this token (SHIFTLOG_TOKEN): it is unknown, revoked or "
            "expired"
        )
    if isinstance(error, NotFound):
        return f"Shiftlog has no run {config.run} this token may see ({error.detail or error})"
    if isinstance(error, ShiftlogError):
        return f"Shiftlog refused: {error}"
    return f"{type(error).__name__}: {error}"


@contextlib.contextmanager
def _plainly(config: Config) -> Iterator[None]:
    """Shiftlog's errors become a ToolError with a plain message (an `isError` result)."""
    try:
        yield
    except (ShiftlogError, *TRANSPORT_ERRORS) as e:
        raise ToolError(_why(config, e)) from None


def _allow(tool_input: Any) -> str:
    return json.dumps({"behavior": "allow", "updatedInput": tool_input})


def _deny(message: str) -> str:
    return json.dumps({"behavior": "deny", "message": message})


async def _decided(client: AsyncClient, config: Config, decision: ToolDecision) -> ToolDecision:
    """Wait (long-polling) while a person has not decided; a run that stops meanwhile takes the
    call back (it leaves the inbox)."""
    while decision.pending:
        if decision.run_status in STOPPED_STATUSES:
            with contextlib.suppress(ShiftlogError):
                await client.withdraw_tool_call(str(decision.id))
            return decision
        await client.heartbeat(config.run)
        decision = await client.get_tool_call(str(decision.id), wait=POLL_WAIT)
    return decision


async def ask(config: Config, tool_name: str, tool_input: dict[str, Any], call_id: str | None):
    """Shiftlog's answer on one tool call, as Claude Code's permission-prompt-tool JSON."""
    try:
        async with config.client() as client:
            first = await client.request_tool_call(
                config.run,
                tool_name,
                tool_input,
                call_id=call_id or None,
                root=str(config.folder) if config.folder else None,
            )
            decision = await _decided(client, config, first)
    except (ShiftlogError, *TRANSPORT_ERRORS) as e:
        return _deny(f"Not run: {_why(config, e)}")
    if decision.pending:
        return _deny(f"Not run: the run is {decision.run_status.replace('_', ' ')}")
    if decision.rewound:
        rewind = decision.rewound
        return _deny(
            f"Not run: the run was rewound to checkpoint {rewind.get('checkpoint')} by "
            f"{rewind.get('by')}; restore the folder from that checkpoint before going on"
        )
    if decision.allowed:
        return _allow(decision.input if decision.input is not None else tool_input)
    status = f" (the run is {decision.run_status})" if decision.run_status else ""
    return _deny(f"Shiftlog refused this call: {decision.reason or decision.decision}{status}")


def _entry_line(entry) -> str:
    pin = " (pinned)" if entry.pinned else ""
    return f"- {entry.key} [{entry.scope}]{pin}: {entry.text}"


def build(config: Config) -> MCPServer:
    """The MCP server for one run (the tools close over `config`)."""
    server = MCPServer(
        "shiftlog",
        instructions=(
            f"Shiftlog supervises this work as run {config.run}: ask `approve` before a risky "
            "tool call, keep what later sessions need with `remember`, and call `finish` when "
            "you believe you are done (the run's own checks decide)."
        ),
        log_level="WARNING",
    )

    @server.tool(
        name="approve",
        description="Ask Shiftlog whether a tool call may run (the run's policy, or a person, "
        "decides; this waits for the person). Answers a JSON text: "
        '{"behavior": "allow", "updatedInput": {...}} (run it with that input, a person may have '
        'edited it) or {"behavior": "deny", "message": "why"}.',
        structured_output=False,
    )
    async def approve(
        tool_name: Annotated[str, Field(min_length=1, max_length=100)],
        input: dict[str, Any],  # the name Claude Code sends
        tool_use_id: str | None = None,
    ) -> str:
        return await ask(config, tool_name, input, tool_use_id)

    @server.tool(
        description="Remember something for later sessions of this run (scope run) or every "
        "later run of its project (scope project), under a short key; the same key replaces.",
        structured_output=False,
    )
    async def remember(
        key: Annotated[str, Field(min_length=1, max_length=100)],
        text: Annotated[str, Field(min_length=1, max_length=20_000)],
        pinned: bool = False,
        scope: Literal["run", "project"] = "run",
    ) -> str:
        with _plainly(config):
            async with config.client() as client:
                entries = await client.remember(config.run, key, text, pinned=pinned, scope=scope)
        return f"Remembered {key!r} ({scope} memory, {len(entries)} entries in all)."

    @server.tool(
        description="What this run (and its project) remembers, most useful first; a query "
        "keeps the entries whose key or text contains it.",
        structured_output=False,
    )
    async def recall(query: Annotated[str, Field(max_length=200)] = "") -> str:
        with _plainly(config):
            async with config.client() as client:
                entries = await client.read_memory(config.run)
        wanted = query.strip().casefold()
        found = [e for e in entries if wanted in f"{e.key}\n{e.text}".casefold()]
        if not found:
            return f"Nothing remembered matches {query!r}." if wanted else "Nothing remembered."
        return "\n".join(_entry_line(e) for e in found[:RECALL_LIMIT])

    @server.tool(
        description="End this session with a handoff: what is done, what comes next, what is "
        "open. The next session (a new context window) starts from it; the answer is that "
        "session's first message.",
        structured_output=False,
    )
    async def handoff(
        summary: Annotated[str, Field(min_length=1, max_length=50_000)],
        done: list[str] | None = None,
        next_steps: list[str] | None = None,
        open_questions: list[str] | None = None,
    ) -> str:
        with _plainly(config):
            async with config.client() as client:
                if config.folder:
                    await client.upload_workspace(config.run, config.folder)
                context = await client.handoff(
                    config.run,
                    summary,
                    done=done or (),
                    next_steps=next_steps or (),
                    open_questions=open_questions or (),
                )
        head = f"Handoff stored; session {context.session} starts from it"
        return f"{head}:\n\n{context.first_message}" if context.first_message else head + "."

    @server.tool(
        description="Save the work as a checkpoint a person can rewind the run to (with a "
        "folder configured, the folder as it is now).",
        structured_output=False,
    )
    async def checkpoint(label: Annotated[str, Field(max_length=200)] = "") -> str:
        with _plainly(config):
            async with config.client() as client:
                if config.folder:
                    uploaded = await client.upload_workspace(config.run, config.folder)
                    if not label:
                        return (
                            f"Checkpoint {uploaded.checkpoint}: the folder as uploaded "
                            f"({uploaded.files} files)."
                        )
                made = await client.create_checkpoint(config.run, label)
        return f"Checkpoint {made.number}" + (f" ({made.label})" if made.label else "") + "."

    @server.tool(
        description="Say you are done. Shiftlog runs the run's checks itself (your word is "
        "not enough): the answer says whether they pass and, if not, what failed; then fix "
        "it and finish again.",
        structured_output=False,
    )
    async def finish(summary: Annotated[str, Field(min_length=1, max_length=50_000)]) -> str:
        with _plainly(config):
            async with config.client() as client:
                if config.folder:
                    await client.upload_workspace(config.run, config.folder)
                result = await client.finish(config.run, summary)
        return result.report()

    return server


def config_from(argv: list[str]) -> Config:
    parser = argparse.ArgumentParser(
        prog="shiftlog-mcp",
        description="An MCP server (stdio) for one Shiftlog run: approve, remember, recall, "
        "handoff, checkpoint, finish. The token is read from SHIFTLOG_TOKEN only.",
    )
    parser.add_argument("--run", default=os.environ.get("SHIFTLOG_RUN"), help="$SHIFTLOG_RUN")
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"), help="$SHIFTLOG_URL")
    parser.add_argument(
        "--agent",
        default=os.environ.get("SHIFTLOG_AGENT") or DEFAULT_AGENT,
        help="this agent's id in the run's log ($SHIFTLOG_AGENT)",
    )
    parser.add_argument(
        "--dir", default=os.environ.get("SHIFTLOG_DIR"), help="the agent's folder ($SHIFTLOG_DIR)"
    )
    args = parser.parse_args(argv)
    token = os.environ.get("SHIFTLOG_TOKEN", "")
    missing = [
        name for name, value in (("SHIFTLOG_URL", args.url), ("SHIFTLOG_TOKEN", token)) if not value
    ]
    if not args.run:
        missing.append("SHIFTLOG_RUN (or --run)")
    if missing:
        parser.error(f"set {', '.join(missing)}")
    if not str(args.run).isdigit() or int(args.run) < 1:
        parser.error(f"the run must be a run's id (a number), not {args.run!r}")
    folder = Path(args.dir).resolve() if args.dir else None
    if folder is not None and not folder.is_dir():
        parser.error(f"--dir {args.dir}: no such folder")
    return Config(args.url, token, int(args.run), args.agent, folder)


def main(argv: list[str] | None = None) -> int:
    if MCPServer is None:
        print("shiftlog-mcp needs the MCP SDK: pip install 'shiftlog-client[mcp]'", file=sys.stderr)
        return 2
    config = config_from(list(sys.argv[1:] if argv is None else argv))
    build(config).run("stdio")
    return 0


if __name__ == "__main__":
    sys.exit(main())
