"""A LangGraph graph driving an external Shiftlog run (shiftlog_client.langgraph).

Two nodes: `model` (Claude through the Messages API) and `tools` (`bash`, `write_file`, confined
to `--workspace`). The tools node asks Shiftlog before each call with `run_tool`, which pauses
the graph with LangGraph's `interrupt()`; `drive` asks Shiftlog (the run's policy, or a person
in the inbox) and resumes the graph with `Command(resume=decision)`. Each step's usage is a turn;
when the graph ends, the workspace is uploaded and the harness runs the run's checks, feeding
failures back into the graph.

    ANTHROPIC_API_KEY=… python examples/langgraph_graph/agent.py --url http://127.0.0.1:8000 \\
        --token shl_… --run 12 --workspace /tmp/agent-ws
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path
from typing import Any

import anthropic
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph
from shiftlog_client import Client, ExternalRun
from shiftlog_client.langgraph import drive, run_tool

SYSTEM = (
    "You work in a folder of your own through two tools: `bash` runs a command there and "
    "`write_file` writes a file there. A supervisor checks every call; a refused call comes back "
    "saying why: do not try to get around it. When the goal is met, answer without a tool call: "
    "the supervisor then runs the goal's checks and tells you what failed, if anything."
)
TOOLS: list[dict[str, Any]] = [
    {"name": "bash", "description": "Run a bash command in the workspace; returns its output.",
     "input_schema": {"type": "object", "properties": {"command": {"type": "string"}},
                      "required": ["command"]}},
    {"name": "write_file", "description": "Write a text file (path relative to the workspace).",
     "input_schema": {"type": "object", "required": ["path", "content"],
                      "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}},
]  # fmt: skip
OUTPUT_LIMIT = 20_000


def to_messages_api(messages: list[Any]) -> list[dict[str, Any]]:
    """The graph's LangChain messages as Messages API turns (tool results merged per turn)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if isinstance(m, AIMessage):
            blocks: list[dict[str, Any]] = (
                [{"type": "text", "text": m.content}] if m.content else []
            )
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]}
                       for c in m.tool_calls]  # fmt: skip
            out.append({"role": "assistant", "content": blocks})
        elif isinstance(m, ToolMessage):
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            out.append({"role": "user", "content": str(m.content)})
    return out


def build_graph(workspace: Path, model: str, timeout: float = 120.0):
    root = workspace.resolve()
    claude = anthropic.Anthropic()

    def bash(input: dict[str, Any]) -> tuple[str, bool]:
        done = subprocess.run(["bash", "-c", str(input["command"])], cwd=root, text=True,
                              capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip
        output = (done.stdout + done.stderr)[-OUTPUT_LIMIT:].rstrip()
        return f"{output}\n[exit {done.returncode}]".lstrip(), done.returncode != 0

    def write_file(input: dict[str, Any]) -> str:
        target = (root / str(input["path"])).resolve()
        if not target.is_relative_to(root):
            raise ValueError(f"{input['path']} is outside the workspace")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(str(input["content"]))
        return f"wrote {input['path']}"

    hands = {"bash": bash, "write_file": write_file}

    def call_model(state: MessagesState) -> dict[str, Any]:
        reply = claude.messages.create(model=model, max_tokens=4096, system=SYSTEM, tools=TOOLS,
                                       messages=to_messages_api(state["messages"]))  # fmt: skip
        text = "\n".join(b.text for b in reply.content if b.type == "text").strip()
        calls = [{"id": b.id, "name": b.name, "args": b.input}
                 for b in reply.content if b.type == "tool_use"]  # fmt: skip
        u = reply.usage
        usage = {"input_tokens": u.input_tokens, "output_tokens": u.output_tokens,
                 "total_tokens": u.input_tokens + u.output_tokens,
                 "input_token_details": {"cache_read": u.cache_read_input_tokens or 0,
                                         "cache_creation": u.cache_creation_input_tokens or 0}}  # fmt: skip
        return {"messages": [AIMessage(content=text, tool_calls=calls, usage_metadata=usage,
                                       response_metadata={"model_name": reply.model})]}  # fmt: skip

    def unanswered(state: MessagesState) -> list[dict[str, Any]]:
        answered = {m.tool_call_id for m in state["messages"] if isinstance(m, ToolMessage)}
        last_ai = next(m for m in reversed(state["messages"]) if isinstance(m, AIMessage))
        return [c for c in last_ai.tool_calls if c["id"] not in answered]

    def call_tool(state: MessagesState) -> dict[str, Any]:
        # One call per step: a node that resumes from an interrupt runs again from its start,
        # so a second call in the same step would run the first one twice.
        call = unanswered(state)[0]
        fn = hands.get(call["name"])
        if fn is None:
            output = f"no tool named {call['name']}"
        else:
            output = run_tool(call["name"], call["args"], fn)
        return {"messages": [ToolMessage(content=output, tool_call_id=call["id"])]}

    def route(state: MessagesState) -> str:
        return "tools" if unanswered(state) else END

    graph = StateGraph(MessagesState)
    graph.add_node("model", call_model)
    graph.add_node("tools", call_tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route, ["tools", END])
    graph.add_conditional_edges("tools", lambda s: "tools" if unanswered(s) else "model",
                                ["tools", "model"])  # fmt: skip
    return graph.compile(checkpointer=InMemorySaver())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SHIFTLOG_URL"))
    parser.add_argument("--token", default=os.environ.get("SHIFTLOG_TOKEN"))
    parser.add_argument("--run", type=int, required=True, help="the external run's id")
    parser.add_argument("--workspace", type=Path, required=True, help="the agent's own folder")
    parser.add_argument("--model", default=os.environ.get("AGENT_MODEL", "claude-sonnet-4-5"))
    parser.add_argument("--max-finishes", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.url or not args.token:
        parser.error("--url and --token (or SHIFTLOG_URL and SHIFTLOG_TOKEN) are required")
    args.workspace.mkdir(parents=True, exist_ok=True)
    with Client(args.url, args.token) as shiftlog:
        run = ExternalRun(shiftlog, args.run)
        context = run.context()
        print(f"run {run.run_id}, session {context.session}: {context.run_status}", flush=True)
        verdict = drive(build_graph(args.workspace, args.model), run,
                        {"messages": [{"role": "user", "content": context.first_message}]},
                        workspace=args.workspace, max_finishes=args.max_finishes)  # fmt: skip
        print(verdict.report() if verdict else f"the run stopped: {run.status}", flush=True)
        print(f"run status: {run.status}", flush=True)
        return 0 if run.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
