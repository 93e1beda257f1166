"""A run's live branch: the seq ranges its rewinds left off it (`EventQuerySet.abandoned_ranges`,
`on_live_branch`), worked out from its `run.rewound` events alone (no database here)."""

from __future__ import annotations

from collections.abc import Iterable


def abandoned(rewinds: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (after, upto] seq ranges off the live branch, from a run's rewinds in order, each
    (to_seq, from_seq): a rewind abandons what followed its checkpoint, up to the rewind. It also
    brings back that checkpoint's own history: a range made by a rewind that came after the
    checkpoint (its range ends at or past it) does not apply, since those events were live when
    the checkpoint was taken. So a rewind to a checkpoint on an abandoned branch resumes that
    branch, with the conversation that matches its workspace.

    The ranges in force when the checkpoint was taken are those after the last rewind before it
    (`from_seq` grows with each rewind), which may be ranges a rewind since has dropped."""
    ranges: list[tuple[int, int]] = []
    after: list[tuple[int, list[tuple[int, int]]]] = []  # (from_seq, the ranges after that rewind)
    for to_seq, from_seq in rewinds:
        then = [r for f, r in after if f < to_seq]
        ranges = [*(then[-1] if then else []), (to_seq, from_seq)]
        after.append((from_seq, ranges))
    return ranges


def in_ranges(seq: int, ranges: list[tuple[int, int]]) -> bool:
    """Whether seq lies on a branch a rewind abandoned (`EventQuerySet.abandoned_ranges`)."""
    return any(after < seq <= upto for after, upto in ranges)
