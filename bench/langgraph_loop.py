#!/usr/bin/env python
"""The reference for step_overhead.py: a LangGraph tool-calling loop of the same shape.

    .venv/bin/python bench/langgraph_loop.py --steps 2000     # prints one JSON object

A StateGraph with the usual message state (`add_messages`), an "agent" node that plays a script
(no model: each turn is an AIMessage with one `read_file` tool call, the last one none) and a
"tools" node that reads the same ~200-byte file and answers with a ToolMessage, checkpointed
by SqliteSaver into a fresh SQLite file, one thread, one `invoke` for the whole run. A step is
one agent turn plus its tool call, as in step_overhead.py; its time is the gap between two
consecutive agent turns (time.perf_counter() stamped in the agent node). Windows: steps 51-150
("100"), 951-1,050 ("1000") and the last 100 steps. Database bytes: the SQLite file and its
-wal after the run, over the steps.

Needs the `bench` extra (`pip install -e '.[bench]'`); step_overhead.py runs this in a child
process and reports null when LangGraph is not installed. The temporary folder is deleted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated, TypedDict

NOTES = "".join(f"line {i}: the quick brown fox jumps over the lazy dog\n" for i in range(1, 5))


def available() -> tuple[bool, str]:
    try:
        import langgraph  # noqa: F401
        from langgraph.checkpoint.sqlite import SqliteSaver  # noqa: F401
    except ImportError as e:
        return False, str(e)
    from importlib.metadata import version

    return (
        True,
        f"langgraph {version('langgraph')}, SqliteSaver {version('langgraph-checkpoint-sqlite')}",
    )


def measure(steps: int) -> dict:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.graph.message import add_messages

    # Functional form: this module's annotations are strings (from __future__ import annotations).
    State = TypedDict("State", {"messages": Annotated[list, add_messages], "step": int})  # noqa: UP013

    folder = Path(tempfile.mkdtemp(prefix="shiftlog-bench-langgraph-"))
    try:
        notes = folder / "notes.txt"
        notes.write_text(NOTES)
        stamps: list[float] = []

        def agent(state: dict) -> dict:
            stamps.append(time.perf_counter())
            i = state["step"] + 1
            if i >= steps:
                return {"messages": [AIMessage(content="Done.")], "step": i}
            call = {"name": "read_file", "args": {"path": "notes.txt"}, "id": f"call_{i}"}
            text = f"Step {i}: reading the notes again."
            return {"messages": [AIMessage(content=text, tool_calls=[call])], "step": i}

        def tools(state: dict) -> dict:
            call = state["messages"][-1].tool_calls[0]
            output = (folder / call["args"]["path"]).read_text()
            return {"messages": [ToolMessage(content=output, tool_call_id=call["id"])]}

        def route(state: dict) -> str:
            return "tools" if state["messages"][-1].tool_calls else END

        graph = StateGraph(State)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", END])
        graph.add_edge("tools", "agent")
        db = folder / "checkpoints.sqlite"
        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            app = graph.compile(checkpointer=SqliteSaver(conn))
            started = time.perf_counter()
            app.invoke(
                {
                    "messages": [HumanMessage(content="Read the notes file over and over.")],
                    "step": 0,
                },
                {"configurable": {"thread_id": "bench"}, "recursion_limit": 2 * steps + 10},
                # Each step's checkpoint saved before the next step runs, as Shiftlog's events are
                # committed (the default, "async", saves in the background and waits at the end).
                durability="sync",
            )
            wall = time.perf_counter() - started
        finally:
            conn.close()
        size = sum(p.stat().st_size for p in folder.glob("checkpoints.sqlite*"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    deltas = {k + 1: (stamps[k] - stamps[k - 1]) * 1000 for k in range(1, len(stamps))}

    def window(first: int, last: int) -> float | None:
        values = [deltas[k] for k in range(first, last + 1) if k in deltas]
        return statistics.median(values) if len(values) >= 2 else None

    result = {
        "steps": len(stamps),
        "wall_s": wall,
        "ms_per_step_wall": wall * 1000 / max(len(stamps), 1),
        "db_bytes": size,
        "db_bytes_per_step": size / max(len(stamps), 1),
        "windows": {},
    }
    for label, (first, last) in {
        "100": (51, 150),
        "1000": (951, 1050),
        str(steps): (max(2, steps - 99), steps),
    }.items():
        if last <= len(stamps):
            result["windows"][label] = window(first, last)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    ok, why = available()
    if not ok:
        print(json.dumps({"available": False, "why": why}))
        return 0
    result = measure(args.steps)
    result.update(available=True, version=why)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
