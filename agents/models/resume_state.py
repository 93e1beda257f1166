"""Where a run's next session starts after a rewind or a fork (Run.resume_state)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agents.models import Checkpoint


@dataclass(frozen=True)
class ResumeState:
    """Where a run's next session starts after a rewind or a fork: the checkpoint's handoff and
    provider place, plus a person's note. Written by a rewind and by a fork; the next session
    reads it once (then it is `consumed`), and the provider's place is read from it until the
    live branch has a model turn of its own."""

    checkpoint_id: int
    handoff: dict[str, Any] | None = None
    note: str = ""
    provider_meta: dict[str, Any] = field(default_factory=dict)
    consumed: bool = False

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint, note: str = "") -> ResumeState:
        return cls(
            checkpoint_id=checkpoint.pk,
            handoff=checkpoint.handoff,
            note=note,
            provider_meta=(checkpoint.state or {}).get("provider_meta", {}),
        )

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ResumeState | None:
        if not data:
            return None
        return cls(
            checkpoint_id=data.get("checkpoint_id") or 0,
            handoff=data.get("handoff"),
            note=data.get("note") or "",
            provider_meta=data.get("provider_meta") or {},
            consumed=bool(data.get("consumed")),
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
