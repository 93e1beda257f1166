"""Hooks the core calls and features register with, so that the core names no feature.

The status machine (`agents/lifecycle.py`), a person's controls (`agents/services.py`) and a
rewind (`agents/rewinds/`) call these at fixed points; a feature (a fleet's cascade, say:
`agents/fleets/cascade.py`) registers a function when the app is ready (`AgentsConfig.ready`).
A hook calls its functions in the order they registered, in the caller's transaction; what one
raises reaches the caller, as if the core had called the feature itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Hook:
    """A named list of functions, each registered once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._functions: list[Callable[..., None]] = []

    def register(self, function: Callable[..., None]) -> Callable[..., None]:
        if function not in self._functions:
            self._functions.append(function)
        return function

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        for function in list(self._functions):
            function(*args, **kwargs)

    def collect(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Each function's answer, in order (None answers left out)."""
        answers = [function(*args, **kwargs) for function in list(self._functions)]
        return [a for a in answers if a is not None]

    def __repr__(self) -> str:
        return f"Hook({self.name!r}, {len(self._functions)} registered)"


# (run, previous, actor): a run's status changed (`run.status` is the new one), inside the
# transition's transaction, after the run's row and its `run.status` event.
status_changed = Hook("status_changed")
# (run_id, action, cause, actor): a person paused, resumed or cancelled the run (action
# "pause", "resume" or "cancel"), after its transition.
controlled = Hook("controlled")
# (run_id, checkpoint, actor): a run was rewound to `checkpoint`, inside the rewind's
# transaction, after its `run.rewound` event and before it is queued again.
rewound = Hook("rewound")
# (run, approval_ids, actor): a person's decision of these approvals, inside its transaction,
# after their `approval.decided` events and after the run was queued again if nothing else waits
# (an external agent's call is settled here: agents/runtime/external_settle.py).
decided = Hook("decided")
# (s, gate) -> a feature's part of a slice (a fleet's parent: agents/fleets/parent.py `Fleet`):
# its `tools` (harness tool name -> function(block, tool_input)) and `at_start()`, run when a
# slice opens (a worker's, or an external agent's call).
slice_part = Hook("slice_part")
# (run) -> what a run has spent counting what it spends through others (a fleet's parent: its
# children's rollup, with `tokens` and `cost_usd`), or None.
spent_with_children = Hook("spent_with_children")
