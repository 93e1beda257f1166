"""What a change feed knows, shared with every process: a checkpoint or rewind started by a process
that does not watch the workspace (the web's "Checkpoint now", `manage.py checkpoint_run`, a
rewind carried out by another worker) looks only at the folders the watching worker saw change,
as the worker itself would.

The journal. A feed that settles on a stat cache kept in a file (`<cache>`, see cache.py)
publishes beside it `<cache>.feed`: a header line naming the publisher (a random token, its pid),
then for each of the worker's checkpoints a baseline line, ["base", [inode, size, mtime_ns] of the
cache file as that checkpoint left it, [folders whose records hold entries not to be trusted as
they are]], followed by one line per folder changed since (["d", key]: list it again; ["D", key]:
walk it whole), in the order the feed saw them; ["lost", why] when the feed lost events,
["closed"] when it stopped watching. Everything is appended (a checkpoint adds a baseline line,
no file is made); the file is rewritten (temp file + rename) only when it has grown past
MAX_BYTES. The feed keeps a thread reading its inotify queue, so the journal follows the
workspace.

Invariant: every change to the workspace since the scan that wrote a baseline's cache file started
is in the lines after that baseline, or will be once the publisher has read its queue up to now.

"Up to now" is a handshake, through `<cache>.flush/`, a folder the feed watches through the same
inotify instance as the workspace. A reader asks in one of two ways:
- it writes its name to the publisher's FIFO there (`<token>.fifo`, named by the journal's
  header): no file is made, which is what a request costs most (an ext4 create after the process
  slept took 0.4 ms). The writer's close is an event in the instance's queue; the publisher then
  reads the names in the FIFO and reads its queue again until it is empty before it acks them:
  every change made before a name was written was queued before the name could be read, so it is
  in the lines above the ack;
- or (its first request, before it has read the header; or when the FIFO cannot be written) it
  creates a file named so there: one instance's events are queued in the order they happened, so
  by the time the publisher reads that creation it has read every change made before it.
Either way the publisher appends ["ack", name] after those changes. A reader that sees its ack, a
header that is still the publisher's, no "lost" or "closed", and the cache file still exactly as
the header names it, may take the cache's records for every folder not listed. Anything else
(no journal, no ack within ACK_TIMEOUT, a cache rewritten since) means a full scan, as before.

A reader never writes the cache file or the journal: what it finds is listed again next time
(cheap), and the worker's own feed stays trusted. It parses only the cache records it needs
(lazy.py): the folders listed and their neighbours, not the whole file. It reads the cache
file while the publisher answers (the baseline before its request names it; kept only if the
answer ends with that same baseline), looks for the answer without sleeping for its first
milliseconds, and keeps what it indexed and parsed of a cache file for its next read.

Known limits are the feed's (feed.py): writes through a shared mapping show at close, a change
through a hard link from outside the workspace is not seen.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.snapshots.cache import StatCache
from agents.snapshots.lazy import load_lazy

ACK_TIMEOUT = 0.5  # seconds a reader waits for the publisher before scanning everything
# A reader looks for its ack without sleeping for the first _SPIN seconds (a publisher answers
# in a fraction of a millisecond; a sleep's wake-up alone can cost that), then every _POLL.
_SPIN = 0.002
_POLL = 0.0002
MAX_BYTES = 256 * 1024  # a journal is rewritten at a baseline once it is this long
_NAME = re.compile(rb"[0-9]{1,10}-[0-9a-f]{12}")  # a reader's request (borrow)
_FIFO = re.compile(r"[0-9a-f]{16}\.fifo")  # a publisher's FIFO, as its header names it
_ACK = b'["ack", '


def journal_path(cache_path: str | os.PathLike) -> Path:
    return Path(os.fspath(cache_path) + ".feed")


def flush_dir(cache_path: str | os.PathLike) -> Path:
    return Path(os.fspath(cache_path) + ".flush")


# -- the publisher's side (called by feed.ChangeFeed under its lock) ---------------------------


class Publisher:
    """Writes one feed's journal for one cache file. Only the journal file it created itself
    (same inode) is appended to: another process's feed that took the journal over since
    (a lingering feed in a second worker) stops this one publishing until its next baseline."""

    def __init__(self, cache_path: Path):
        self.cache_path = Path(cache_path)
        self.path = journal_path(cache_path)
        self.flush = flush_dir(cache_path)
        self.token = secrets.token_hex(8)
        self.ino: int | None = None  # the journal file this publisher wrote
        self.size = 0
        self.base: list[int] | None = None
        self.fifo = f"{self.token}.fifo"  # in the flush folder: readers write their names to it
        self.fifo_fd: int | None = None  # its read end (None: there is none, readers make files)

    def baseline(self, cache_id: list[int], stale: list[str], keys: list[list[str]]) -> bool:
        """A checkpoint left the cache file as `cache_id`: a new baseline, then `keys` (what
        changed since that checkpoint's scan began)."""
        lines = [["base", cache_id, stale], *keys]
        if self.ino is not None and self.size < MAX_BYTES:
            if not self.append(lines):
                return False
            self.base = cache_id
            return True
        try:
            self.flush.mkdir(parents=True, exist_ok=True)
        except OSError:
            self.ino = None
            return False
        self._open_fifo()
        header = {"shiftlog-feed": 2, "token": self.token, "pid": os.getpid()}
        if self.fifo_fd is not None:
            header["fifo"] = self.fifo
        data = "\n".join([json.dumps(header)] + [json.dumps(x) for x in lines]) + "\n"
        try:
            tmp = self.path.with_name(f".{self.path.name}.{self.token}.tmp")
            with open(tmp, "w") as f:
                f.write(data)
                st = os.fstat(f.fileno())
            os.replace(tmp, self.path)
        except OSError:
            self.ino = None
            return False
        self.ino, self.size, self.base = st.st_ino, st.st_size, cache_id
        return True

    def _open_fifo(self) -> None:
        """Make the FIFO readers ask through, once (made and opened beside the flush folder, then
        moved in: a FIFO seen there always has had its reader). On a filesystem without FIFOs
        there is none, and readers make files. FIFOs left by publishers gone since (a killed
        worker: nobody reads them) are removed."""
        if self.fifo_fd is not None:
            return
        tmp = self.path.with_name(f".{self.path.name}.{self.token}.fifo")
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            os.mkfifo(tmp, 0o600)
            fd = os.open(tmp, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        try:
            os.replace(tmp, self.flush / self.fifo)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return
        self.fifo_fd = fd
        with contextlib.suppress(OSError), os.scandir(self.flush) as found:
            for entry in found:
                if entry.name != self.fifo and _FIFO.fullmatch(entry.name):
                    _remove_if_unread(Path(entry.path))

    def requests(self) -> list[str]:
        """The names readers wrote to the FIFO since the last call (a name is whole: a write of
        fewer than PIPE_BUF bytes is never split; anything else is not a request)."""
        if self.fifo_fd is None:
            return []
        chunks = []
        while True:
            try:
                chunk = os.read(self.fifo_fd, 65536)
            except OSError:  # BlockingIOError: nothing more now
                break
            if not chunk:  # no writer has it open
                break
            chunks.append(chunk)
        return [raw.decode() for raw in b"".join(chunks).split(b"\n") if _NAME.fullmatch(raw)]

    def close(self) -> None:
        """The FIFO removed (a feed that stops publishing here)."""
        if self.fifo_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.flush / self.fifo)
            os.close(self.fifo_fd)
            self.fifo_fd = None

    def append(self, lines: list[list]) -> bool:
        """Append `lines`; False (and stop) when the journal is no longer this publisher's."""
        if self.ino is None or not lines:
            return self.ino is not None
        data = ("\n".join(json.dumps(x) for x in lines) + "\n").encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError:
            self.ino = None
            return False
        try:
            if os.fstat(fd).st_ino != self.ino:
                self.ino = None
                return False
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError:
            self.ino = None
            return False
        finally:
            os.close(fd)
        self.size += len(data)
        return True


def _remove_if_unread(path: Path) -> None:
    """Remove a FIFO no process reads (its publisher is gone: opening it to write says so)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno == errno.ENXIO:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return
    os.close(fd)


# -- the reader's side ---------------------------------------------------------------------


class Borrowed:
    """What a reader learnt: the cache file's identity, the folders changed since (and those
    with entries not to be trusted), the folders new since, and (when asked to load it) the
    cache file's records as that identity names them (`cache`, None if it is gone since)."""

    __slots__ = ("cache", "cache_id", "deep", "listed", "meanwhile")

    def __init__(self, cache_id: tuple[int, int, int], listed: set[str], deep: set[str]):
        self.cache_id = cache_id
        self.listed = listed
        self.deep = deep
        self.cache: StatCache | None = None
        self.meanwhile: Any = None  # what borrow's `meanwhile` gave, when it holds for the answer


def _read(path: Path) -> bytes | None:
    """The journal's complete lines, when its header is one this code reads."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    end = data.rfind(b"\n")
    if end < 0:
        return None
    data = data[: end + 1]  # what follows the last newline is a line still being written
    try:
        header = json.loads(data[: data.index(b"\n")])
    except ValueError:
        return None
    if not isinstance(header, dict) or header.get("shiftlog-feed") != 2:
        return None
    return data


def _last_base(data: bytes) -> tuple[list, int] | None:
    """The journal's last baseline line, parsed, and where it starts."""
    at = data.rfind(b'\n["base", ')
    if at < 0:
        return None
    try:
        line = json.loads(data[at + 1 : data.index(b"\n", at + 1)])
    except ValueError:
        return None
    return line, at + 1


def _cache_id(base: list) -> tuple[int, int, int] | None:
    cache_id = base[1] if len(base) == 3 else None
    if not (isinstance(cache_id, list) and len(cache_id) == 3):
        return None
    return tuple(cache_id)


_FIFOS: dict[Path, str] = {}  # journal -> the FIFO its header named at this process's last read


def borrow(
    cache_path: Path,
    *,
    timeout: float = ACK_TIMEOUT,
    load: bool = False,
    meanwhile: Callable[[StatCache, set[str], set[str]], Any] | None = None,
) -> Borrowed | None:
    """The folders changed since the cache file at `cache_path` was written, from the journal of
    the feed that watches its workspace, flushed up to now; None when there is no trusted one.

    With `load`, the cache file's records too (`Borrowed.cache`, see load_lazy). They are read
    while the publisher answers, as the baseline before the request names them: when the answer
    ends with that same baseline, that read is the one to use (every change since that cache
    file was written is in the lines after it); else the file is read again as the answer's
    baseline names it.

    With `meanwhile` (and `load`), what the caller would do with the answer is done while it is
    awaited, with what the journal says so far: `meanwhile(cache, listed, deep)`. It began after
    the request, so when the answer names the same folders from the same baseline its result
    is the one the answer would have given (`Borrowed.meanwhile`; else None and the caller does
    it again). An error in it only means it is not used."""
    path = journal_path(cache_path)
    flush = flush_dir(cache_path)
    name = f"{os.getpid()}-{secrets.token_hex(6)}"
    ack = json.dumps(["ack", name]).encode()
    request: Path | None = None  # a request made as a file, removed once answered
    early: tuple[tuple[int, int, int], StatCache | None] | None = None
    done: tuple[tuple[set[str], set[str]], Any] | None = None  # what `meanwhile` gave, and for what
    try:
        # Asked first, read after: the publisher starts on its answer as soon as it can.
        asked = _FIFOS.get(path)
        if asked is None or not _ask(flush / asked, name):
            asked, request = None, _ask_by_file(flush, name)
            if request is None:
                return None  # no flush folder: no feed ever published here
        started = time.monotonic()
        deadline = started + timeout
        data = _read(path)
        if data is None:
            return None
        header = json.loads(data[: data.index(b"\n")])
        if not _alive(header.get("pid")):
            return None
        fifo = header.get("fifo")
        fifo = fifo if isinstance(fifo, str) and _FIFO.fullmatch(fifo) else None
        if fifo is None:
            _FIFOS.pop(path, None)
        else:
            if len(_FIFOS) >= 1024:  # a long-lived web process asks about many runs
                _FIFOS.clear()
            _FIFOS[path] = fifo
        if request is None and asked != fifo and (fifo is None or not _ask(flush / fifo, name)):
            # The FIFO asked is not this journal's publisher's (it changed), and its own could
            # not be written: ask by file.
            request = _ask_by_file(flush, name)
            if request is None:
                return None
        if (
            load
            and ack not in data
            and (base := _last_base(data))
            and (guess := _cache_id(base[0]))
        ):
            early = guess, load_lazy(cache_path, guess)  # meanwhile: the publisher answers
            so_far = _changes(data, base) if meanwhile and early[1] is not None else None
            if so_far is not None:
                early[1].dirs.stale = set(so_far[0])  # type: ignore[attr-defined]
                try:
                    done = so_far, meanwhile(early[1], *so_far)
                except Exception:  # (it is done again with the answer, where it may fail)
                    done = None
        while data is None or ack not in data:
            now = time.monotonic()
            if now > deadline:
                return None
            if now - started < _SPIN:
                os.sched_yield()  # the publisher may be waiting for this core
            else:
                time.sleep(_POLL)
            data = _read(path)
    finally:
        if request is not None:
            with contextlib.suppress(OSError):
                os.unlink(request)
    base = _last_base(data)
    if base is None:
        return None
    cache_id = _cache_id(base[0])
    changes = _changes(data, base) if cache_id is not None else None
    if changes is None:
        return None
    listed, deep = changes
    lent = Borrowed(cache_id, listed, deep)
    if load:
        if early is not None and early[0] == cache_id and early[1] is not None:
            lent.cache = early[1]
            lent.cache.dirs.stale = set(listed)  # type: ignore[attr-defined]
            if done is not None and done[0] == changes:
                lent.meanwhile = done[1]
        else:
            lent.cache = load_lazy(cache_path, cache_id, listed)
    return lent


def _changes(data: bytes, base: tuple[list, int]) -> tuple[set[str], set[str]] | None:
    """(listed, deep): the folders the journal `data` names as changed since its baseline
    (`_last_base`: the line, parsed, and where it starts); None when it lost events or was
    closed since."""
    parsed, at = base
    end = data.index(b"\n", at)
    listed: set[str] = set(parsed[2])
    deep: set[str] = set()
    for raw in data[end + 1 :].split(b"\n")[:-1]:
        if raw.startswith(_ACK):
            continue  # a reader's answer (many: each request adds one)
        try:
            line = json.loads(raw)
        except ValueError:
            return None
        if line[0] == "d":
            listed.add(line[1])
        elif line[0] == "D":
            deep.add(line[1])
        else:
            return None  # lost or closed
    return listed, deep


def _ask(fifo: Path, name: str) -> bool:
    """Write `name` to a publisher's FIFO; False when that cannot be done (no publisher reads
    it, it is full, it is not a FIFO)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        data = name.encode() + b"\n"
        return stat.S_ISFIFO(os.fstat(fd).st_mode) and os.write(fd, data) == len(data)
    except OSError:
        return False
    finally:
        os.close(fd)


def _ask_by_file(flush: Path, name: str) -> Path | None:
    """Ask by making a file named `name` in the flush folder (None: there is no such folder)."""
    request = flush / name
    try:
        fd = os.open(request, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    os.close(fd)
    return request


def _alive(pid: object) -> bool:
    """Whether the publisher's process may still be there (a dead one never answers: no need to
    wait for it). A process of another host or container counts as alive: the wait decides."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
