"""What a blob store raises besides FileNotFoundError (a blob that is not there)."""

from __future__ import annotations

UNREACHABLE = "blob store unreachable: "


class BlobStoreUnavailable(Exception):
    """The store cannot be used now: unreachable, timing out, failing (5xx) or refusing (access
    denied, no such bucket). The message is "blob store unreachable: " and a short reason (the
    store and the error's code, never a secret); a run meeting it pauses with that reason."""

    def __init__(self, reason: str):
        super().__init__(reason if reason.startswith(UNREACHABLE) else UNREACHABLE + reason)


class BlobCorrupt(Exception):
    """A stored blob whose content does not hash to its digest: never returned as if it were
    fine."""

    def __init__(self, digest: str, actual: str):
        self.digest = digest
        self.actual = actual
        super().__init__(f"blob {digest} is corrupt: its content hashes to {actual}")
