"""The fleet tools' schemas: spawning child runs and merging their work back (the runtime runs
them: agents/fleets/parent.py)."""

from __future__ import annotations

SPAWN_RUNS = {
    "name": "spawn_runs",
    "description": (
        "Split the work: start child runs that work in parallel, each in its own copy of your "
        "workspace (the whole of it at a checkpoint taken now, or one folder of it), with its "
        "own goal and done-conditions. You then wait, using nothing, until every child has "
        "ended (wait 'all') or the first one has (wait 'any'); your next message tells you each "
        "child's outcome: status, final handoff, check results and the files it changed. Then "
        "call merge_children to bring the succeeded children's changes into your workspace. "
        "A child's budget is carved out of what remains of yours: give budget_tokens and/or "
        "budget_cost_usd, or leave them out for an even split of what remains."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "children": {
                "type": "array",
                "minItems": 1,
                "description": "The child runs to start, each with its goal and checks.",
                "items": {
                    "type": "object",
                    "properties": {
                        "goal": {
                            "type": "string",
                            "minLength": 1,
                            "description": "What the child is to do, in words.",
                        },
                        "checks": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"type": "string", "minLength": 1},
                            "description": "Shell commands that exit 0 when the child is done.",
                        },
                        "from": {
                            "type": "string",
                            "default": ".",
                            "description": "'.' for your whole workspace, or a folder of it: "
                            "the child works on that folder alone.",
                        },
                        "budget_tokens": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "Tokens the child may spend, out of yours.",
                        },
                        "budget_cost_usd": {
                            "type": "number",
                            "exclusiveMinimum": 0,
                            "description": "Dollars the child may spend, out of yours.",
                        },
                        "provider": {
                            "type": "string",
                            "enum": ["scripted", "anthropic"],
                            "description": "Who drives the child (default: as you are).",
                        },
                        "model": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": 100,
                            "description": "The child's model (default: yours).",
                        },
                        "script": {
                            "type": "object",
                            "description": "For a scripted child: the turns it plays.",
                        },
                    },
                    "required": ["goal", "checks"],
                    "additionalProperties": False,
                },
            },
            "wait": {
                "type": "string",
                "enum": ["all", "any"],
                "default": "all",
                "description": "Wake when every child has ended ('all') or the first has ('any').",
            },
        },
        "required": ["children"],
        "additionalProperties": False,
    },
}

MERGE_CHILDREN = {
    "name": "merge_children",
    "description": (
        "Bring the changes of your succeeded child runs (from where each started to where it "
        "finished) into your workspace as a three-way merge. Changes that do not conflict with "
        "yours apply; a child whose changes conflict is not applied at all, and you get the "
        "conflicting parts (or a person decides them, as the run is set up). A checkpoint is "
        "taken before and after. Without runs, every succeeded child not merged yet is merged."
    ),
    "input_schema": {
        "type": "object",
        "properties": {
            "runs": {
                "type": "array",
                "items": {"type": "integer", "minimum": 1},
                "description": "Child run ids to merge (again, after a conflict you resolved).",
            },
        },
        "additionalProperties": False,
    },
}

FLEET_TOOL_SCHEMAS = [SPAWN_RUNS, MERGE_CHILDREN]
FLEET_TOOLS = frozenset(t["name"] for t in FLEET_TOOL_SCHEMAS)
