"""A folder an agent works in, and the path rules that keep it there."""

from __future__ import annotations

import os
from pathlib import Path

# Folders that are noise to a model (or belong to the harness) in a listing.
SKIPPED_DIRS = frozenset({".git", "__pycache__", ".shiftlog"})


class ToolInputError(Exception):
    """Bad tool input; str(e) is written for the model to read and act on."""


class PathEscape(ToolInputError):
    """A path that points outside the workspace."""


class Workspace:
    """A folder on disk that tools may read and write, and nothing outside it."""

    def __init__(self, path: str | Path) -> None:
        folder = Path(path).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        # Resolve after creating it, so a symlinked parent is resolved too and
        # every later containment check compares real paths with real paths.
        self.path: Path = folder.resolve(strict=True)

    def __repr__(self) -> str:
        return f"Workspace({str(self.path)!r})"

    def resolve(self, rel: str) -> Path:
        """Turn a path given by the model into a real path inside the workspace.

        Symlinks are followed (at every component), and the result must still be
        inside the workspace; anything else raises PathEscape.
        """
        if not isinstance(rel, str):
            raise ToolInputError(f"path must be a string, got {type(rel).__name__}")
        if not rel.strip():
            raise ToolInputError("path is empty; give a path relative to the workspace")
        if "\x00" in rel:
            raise ToolInputError("path contains a NUL byte")

        given = Path(rel)
        candidate = given if given.is_absolute() else self.path / given
        try:
            real = candidate.resolve()
        except (OSError, RuntimeError) as e:  # 3.11 reports a symlink loop as RuntimeError
            raise ToolInputError(f"cannot resolve path {rel}: {e}") from e
        if self._contains(real):
            return real

        # Work out why, so the model knows what to change.
        if self._contains(Path(os.path.normpath(candidate))):
            raise PathEscape(f"path {rel} goes through a symlink that leads outside the workspace")
        if given.is_absolute():
            raise PathEscape(
                f"path {rel} is outside the workspace; use a path relative to the workspace"
            )
        raise PathEscape(f"path {rel} escapes the workspace (too many '..')")

    def relative(self, real: Path) -> str:
        """The workspace-relative form of a resolved path, for messages and the event log."""
        rel = real.relative_to(self.path).as_posix()
        return rel or "."

    def listing(self, limit: int = 200, *, path: str = ".") -> str:
        """A sorted list of the files under `path` (default: the whole workspace), with sizes.

        Paths are relative to the workspace so they can be passed straight to the
        file tools. At most `limit` entries are shown; the rest are counted.
        """
        root = self.resolve(path)
        if not root.is_dir():
            raise ToolInputError(f"{path} is not a directory")
        entries = sorted(self._entries(root))
        if not entries:
            where = "the workspace" if root == self.path else self.relative(root)
            return f"(no files in {where})"
        shown = entries[:limit]
        lines = [line for _, line in shown]
        if len(entries) > limit:
            lines.append(f"... and {len(entries) - limit} more")
        return "\n".join(lines)

    def is_empty(self) -> bool:
        """True when the workspace holds nothing but (at most) the harness's own folder."""
        return all(child.name == ".shiftlog" for child in self.path.iterdir())

    def _contains(self, real: Path) -> bool:
        return real == self.path or self.path in real.parents

    def _entries(self, root: Path) -> list[tuple[str, str]]:
        """(sort key, display line) for every file, symlink and empty folder under root."""
        entries: list[tuple[str, str]] = []
        for folder, dirnames, filenames in os.walk(root):
            here = Path(folder)
            dirnames[:] = [d for d in dirnames if d not in SKIPPED_DIRS]
            # os.walk lists a symlink to a folder among dirnames but never enters it;
            # show it as a link so it does not vanish from the listing.
            for name in list(dirnames):
                if (here / name).is_symlink():
                    dirnames.remove(name)
                    filenames.append(name)
            if not dirnames and not filenames and here != root:
                rel = self.relative(here)
                entries.append((rel, f"{rel}/ (empty)"))
            for name in filenames:
                full = here / name
                rel = self.relative(full)
                if full.is_symlink():
                    entries.append((rel, f"{rel} -> {os.readlink(full)}"))
                    continue
                try:
                    size = full.stat().st_size
                except OSError:
                    continue  # vanished while walking
                entries.append((rel, f"{rel} ({human_size(size)})"))
        return entries


def human_size(size: int) -> str:
    """A short size like '812 B', '4.1 KB' or '2.3 MB'."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KB", "MB", "GB"):
        value /= 1024
        if value < 1024 or unit == "GB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
