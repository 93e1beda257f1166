"""A change feed: which folders of a workspace changed since the last checkpoint (Linux inotify,
through inotify_simple), so a checkpoint looks at those folders only instead of every file.

A feed watches every folder of the workspace (links are never followed) and turns events into
two sets of workspace-relative folders: `dirty` (an entry was created, deleted, moved, written,
truncated or had its mode changed: list that folder again) and `deep` (a folder created or
moved in: walk its whole subtree, since files may have been made in it before its watch was
added). Events are read when a checkpoint takes them (`take`), not by a thread: the kernel queues
them in the meantime (`fs.inotify.max_queued_events`, 16,384 by default), and a queue that
overflows is reported and costs a full scan.

When the feed is trusted. `take()` hands over what the feed saw since the previous `take()` and
empties it. Its Changes are complete since the last checkpoint only when (a) the feed has been
watching without losing anything since then (no queue overflow, no watch that could not be
added, e.g. past `fs.inotify.max_user_watches`; the workspace folder itself not moved or
removed), and (b) that checkpoint was written by this process through this feed, and the stat
cache is still the one it left (`settle` records the cache and its generation; a cache file
written by another process since is read afresh, so it is another object). Anything else, a new
process (a worker restart) included, gets `trusted_for(cache) == False`: the caller scans the
whole workspace, and that scan is the new baseline. A feed that lost events rebuilds its watches
at the next take. Events are drained at take time, after the caller's writes have returned, so
nothing written before a checkpoint starts is missed; what happens during one is reported to
the next.

Known limits (inotify's): writes through a shared memory mapping are reported only when the
file is closed; a file changed through a hard link from outside the workspace is not reported.
A full scan (a new worker process, any loss) corrects both.

One feed per workspace per process (`acquire`/`release`, reference-counted); a released feed
lingers for LINGER_SECONDS so the next slice or a rewind in the same worker process still finds
it trusted. A forked child never uses its parent's feeds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
import time
from pathlib import Path

from inotify_simple import INotify
from inotify_simple import flags as F

from agents.snapshots.journal import Publisher
from agents.snapshots.names import encode_name

MASK = int(
    F.MODIFY
    | F.ATTRIB
    | F.CLOSE_WRITE
    | F.CREATE
    | F.DELETE
    | F.MOVED_FROM
    | F.MOVED_TO
    | F.DELETE_SELF
    | F.MOVE_SELF
    | F.ONLYDIR
    | F.DONT_FOLLOW
    | F.EXCL_UNLINK
)
_OVERFLOW, _IGNORED, _UNMOUNT = int(F.Q_OVERFLOW), int(F.IGNORED), int(F.UNMOUNT)
_SELF_GONE, _ISDIR = int(F.DELETE_SELF | F.MOVE_SELF), int(F.ISDIR)
_GONE, _CAME = int(F.DELETE | F.MOVED_FROM), int(F.CREATE | F.MOVED_TO)
LINGER_SECONDS = 600.0
MAX_IDLE_FEEDS = 8


class Changes:
    """What a feed saw between two takes: `dirty` and `deep` folders (workspace-relative bytes,
    b"" being the top), and `lost` (why they are incomplete, or None)."""

    __slots__ = ("_baseline", "deep", "dirty", "lost")

    def __init__(
        self, dirty: set[bytes], deep: set[bytes], lost: str | None, baseline: tuple | None
    ):
        self.dirty = dirty
        self.deep = deep
        self.lost = lost
        self._baseline = baseline

    def trusted_for(self, cache: object) -> bool:
        """Whether these changes are everything that happened to the workspace since `cache`
        (a StatCache) was last made to match it by this feed's previous checkpoint."""
        if self.lost is not None or self._baseline is None:
            return False
        known, generation = self._baseline
        return known is cache and generation == getattr(cache, "generation", None)

    def keys(self) -> tuple[set[str], set[str]]:
        """The folders as StatCache keys: (to list again, to walk whole)."""
        return {key_of(r) for r in self.dirty}, {key_of(r) for r in self.deep}


def key_of(rel: bytes) -> str:
    """The StatCache key of a workspace-relative folder."""
    return "/".join(encode_name(p) for p in rel.split(b"/")) if rel else ""


def _join(rel: bytes, name: bytes) -> bytes:
    return rel + b"/" + name if rel else name


def _parent(rel: bytes) -> bytes:
    return rel.rpartition(b"/")[0]


class ChangeFeed:
    """Watches one workspace; see the module docstring. Thread-safe."""

    def __init__(self, workspace: str | os.PathLike):
        self.workspace = Path(os.path.realpath(workspace))
        self.root = os.fsencode(self.workspace)
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._inotify: INotify | None = None
        self._wd: dict[int, bytes] = {}  # watch descriptor -> folder
        self._rel: dict[bytes, int] = {}  # folder -> watch descriptor
        self._kids: dict[bytes, set[bytes]] = {}  # watched folder -> its watched sub-folders
        self._dirty: set[bytes] = set()
        self._deep: set[bytes] = set()
        self._lost: str | None = None
        self._baseline: tuple | None = None
        self.closed = False
        self.rebuilds = 0  # times the watches were set up again after a loss (for tests)
        # Sharing what the feed knows with other processes (journal.py): the journal of the
        # cache file last settled on, the watch on its flush folder, and lines not written yet.
        self._publisher: Publisher | None = None
        self._flush_wd: int | None = None
        self._lines: list[list[str]] = []
        self._published: set[tuple[str, str]] = set()
        self._followed = False  # the process's follower reads our queue (_Follower)
        self._asked = False  # a reader wrote to the publisher's FIFO: read it (_drain)
        with self._lock:
            self._start()
        if self._lost is not None and not self._rel:
            reason = self._lost
            self.close()
            raise OSError(f"cannot watch {self.workspace}: {reason}")

    # -- what callers use ------------------------------------------------------------------

    def take(self) -> Changes:
        """Everything seen since the previous take (emptied); see the module docstring."""
        with self._lock:
            if self.closed or os.getpid() != self.pid:
                return Changes(set(), set(), "the feed is closed", None)
            self._drain()
            lost = self._lost
            changes = Changes(self._dirty, self._deep, lost, self._baseline)
            self._dirty, self._deep, self._baseline = set(), set(), None
            if lost is not None:
                self._restart()
            return changes

    def settle(self, cache: object) -> None:
        """Record that `cache` (a StatCache) now matches the workspace as of the last take: the
        next take's changes are trusted for it."""
        with self._lock:
            if self._lost is None and not self.closed:
                self._baseline = (cache, getattr(cache, "generation", None))
                self._publish(cache)

    def pending(self) -> bool:
        """Whether a checkpoint now could find anything new since the last one settled here:
        False only when the feed is trusted and saw nothing (cheap: reads queued events)."""
        with self._lock:
            if self.closed or os.getpid() != self.pid:
                return True
            self._drain()
            return bool(
                self._dirty or self._deep or self._lost is not None or self._baseline is None
            )

    def watched(self) -> int:
        """Folders watched now."""
        return len(self._rel)

    def close(self) -> None:
        with self._lock:
            if self._publisher is not None and not self.closed and os.getpid() == self.pid:
                self._publisher.append([["closed"]])
                self._publisher.close()
            self.closed = True
            if self._inotify is not None and os.getpid() == self.pid:
                if self._followed:
                    FOLLOWER.forget(self._inotify.fileno())
                self._inotify.close()
            self._inotify = None

    # -- sharing with other processes (journal.py) ------------------------------------------

    def _publish(self, cache: object) -> None:
        """A baseline in the journal of the cache file `cache` was settled on (when it has one):
        what happened since its scan began, then every change as the process's follower (_Follower)
        reads it."""
        disk = getattr(cache, "_disk", None)
        if disk is None or os.getpid() != self.pid or self._inotify is None:
            return
        path, cache_id = disk
        if self._publisher is None or self._publisher.cache_path != path:
            if self._publisher is not None:
                self._publisher.close()
                if self._flush_wd is not None:
                    with contextlib.suppress(OSError):
                        self._inotify.rm_watch(self._flush_wd)
            self._publisher = Publisher(path)
            self._flush_wd = None
        publisher = self._publisher
        keys = [["d", key_of(r)] for r in self._dirty] + [["D", key_of(r)] for r in self._deep]
        self._write_lines()
        if publisher.ino is not None and publisher.base == list(cache_id) and self._flush_wd:
            # The same cache file: the lines since its baseline still hold; add what is new.
            for kind, key in keys:
                if (kind, key) not in self._published:
                    self._published.add((kind, key))
                    self._lines.append([kind, key])
            self._write_lines()
            return
        self._published = {(k, v) for k, v in keys}
        stale_keys = getattr(cache.dirs, "stale_keys", None)  # cache.Records: kept as it changes
        stale = (
            sorted(stale_keys()) if stale_keys else [k for k, r in cache.dirs.items() if r.stale]
        )
        if not publisher.baseline(list(cache_id), stale, keys):
            return
        if self._flush_wd is None:
            try:
                self._flush_wd = self._inotify.add_watch(
                    publisher.flush, int(F.CREATE | F.CLOSE_WRITE | F.ONLYDIR | F.DONT_FOLLOW)
                )
            except OSError as e:
                publisher.append([["lost", f"cannot watch the flush folder: {e.strerror}"]])
                return
            self._asked = True  # a name written before the watch: read at the next drain
        if not self._followed:
            self._followed = True
            FOLLOWER.follow(self._inotify.fileno(), self)

    def _note(self, kind: str, rel: bytes) -> None:
        if self._publisher is None:
            return
        key = key_of(rel)
        if (kind, key) not in self._published:
            self._published.add((kind, key))
            self._lines.append([kind, key])

    def _write_lines(self) -> None:
        if self._publisher is not None and self._lines:
            self._publisher.append(self._lines)
        self._lines = []

    def _follow(self, fd: int) -> None:
        """The follower saw our queue readable: read it, so the journal follows."""
        with self._lock:
            if not self.closed and self._inotify is not None and self._inotify.fileno() == fd:
                self._drain()

    # -- events ----------------------------------------------------------------------------

    def _start(self) -> None:
        try:
            self._inotify = INotify(nonblocking=True)
        except OSError as e:  # no instance left (fs.inotify.max_user_instances)
            self._inotify = None
            self._lost = f"no inotify instance could be had: {e.strerror}"
            return
        self._lost = None
        self._watch_tree(b"")

    def _restart(self) -> None:
        """After a loss: set every watch up again on a new inotify instance."""
        if self._inotify is not None:
            if self._followed:
                FOLLOWER.forget(self._inotify.fileno())
            self._inotify.close()
            self._inotify = None
        self._wd, self._rel, self._kids = {}, {}, {}
        self._flush_wd = None  # watched again at the next settle
        self.rebuilds += 1
        self._start()
        if self._followed and self._inotify is not None:
            FOLLOWER.follow(self._inotify.fileno(), self)

    def _drain(self) -> None:
        """Read the queue until it is empty. Names readers wrote to the FIFO are read once it is,
        and acked once the queue has been read empty again after that: a change made before a
        name was written was queued before it (journal.py)."""
        names: list[str] = []
        while self._inotify is not None:
            events = self._inotify.read(timeout=0)
            if not events:
                if not self._asked or self._publisher is None:
                    break
                self._asked = False
                names += self._publisher.requests()
                continue
            for event in events:
                self._handle(event.wd, event.mask, event.name)
        self._lines += [["ack", name] for name in names]
        self._write_lines()

    def _handle(self, wd: int, mask: int, name: str) -> None:
        if mask & _OVERFLOW:
            self._lose("the inotify event queue overflowed")
            return
        if wd == self._flush_wd and wd is not None:
            # A reader asks for the journal up to now: by making a file (every earlier event is
            # handled above), or through the FIFO (read once the queue is empty: _drain).
            if mask & _CAME and name:
                self._lines.append(["ack", name])
            elif name and self._publisher is not None and name == self._publisher.fifo:
                self._asked = True
            return
        rel = self._wd.get(wd)
        if rel is None:  # a watch already removed
            return
        if mask & _IGNORED:
            self._forget(rel, wd)
            if rel == b"":
                self._lose("the workspace folder was removed")
            return
        if mask & _UNMOUNT:
            self._lose("the workspace's filesystem was unmounted")
            return
        if not name:
            # An event on the folder itself. Its mode is in its parent's record.
            if rel == b"":
                if mask & _SELF_GONE:
                    self._lose("the workspace folder was moved or removed")
            else:
                self._dirty.add(_parent(rel))
                self._note("d", _parent(rel))
            return
        self._dirty.add(rel)
        self._note("d", rel)
        if mask & _ISDIR:
            child = _join(rel, os.fsencode(name))
            if mask & _GONE:
                self._unwatch(child)
            if mask & _CAME:
                self._deep.add(child)
                self._note("D", child)
                self._watch_tree(child)

    def _lose(self, reason: str) -> None:
        if self._lost is None:
            self._lost = reason
            self._lines.append(["lost", reason])

    def _watch_tree(self, rel: bytes) -> None:
        """Watch folder `rel` and every folder below it (never through a link)."""
        stack = [rel]
        while stack:
            r = stack.pop()
            path = _join(self.root, r) if r else self.root
            try:
                wd = self._inotify.add_watch(path, MASK)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ENOTDIR) and r:
                    continue  # gone again, or not a folder (a link) any more
                if e.errno == errno.ENOSPC:
                    self._lose("the inotify watch limit was reached (fs.inotify.max_user_watches)")
                else:
                    self._lose(f"a folder could not be watched: {e.strerror}")
                return
            previous = self._wd.get(wd)
            if previous is not None and previous != r:
                self._rel.pop(previous, None)  # the same folder, moved: now at `r`
            self._wd[wd] = r
            self._rel[r] = wd
            if r:
                self._kids.setdefault(_parent(r), set()).add(r)
            try:
                with os.scandir(path) as it:
                    subs = [e.name for e in it if e.is_dir(follow_symlinks=False)]
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as e:
                self._lose(f"a folder could not be listed: {e.strerror}")
                return
            stack.extend(_join(r, name) for name in subs)

    def _unwatch(self, rel: bytes) -> None:
        """Stop watching `rel` and the folders below it (deleted, or moved away)."""
        kids = self._kids.get(_parent(rel)) if rel else None
        if kids is not None:
            kids.discard(rel)
        stack = [rel]
        while stack:
            r = stack.pop()
            stack.extend(self._kids.pop(r, ()))
            wd = self._rel.pop(r, None)
            if wd is None:
                continue
            self._wd.pop(wd, None)
            with contextlib.suppress(OSError):  # the kernel removed it already (folder deleted)
                self._inotify.rm_watch(wd)

    def _forget(self, rel: bytes, wd: int) -> None:
        self._wd.pop(wd, None)
        if self._rel.get(rel) == wd:
            del self._rel[rel]


# -- the feeds this process keeps --------------------------------------------------------------


class _Held:
    __slots__ = ("feed", "released_at", "users")

    def __init__(self, feed: ChangeFeed):
        self.feed = feed
        self.users = 0
        self.released_at = 0.0


_FEEDS: dict[bytes, _Held] = {}
_FEEDS_LOCK = threading.Lock()


def acquire(workspace: str | os.PathLike) -> ChangeFeed | None:
    """The feed of `workspace` in this process, started if needed (None where inotify cannot
    watch it: not Linux, no instance left, the folder missing or unreadable)."""
    key = os.fsencode(os.path.realpath(workspace))
    with _FEEDS_LOCK:
        _expire()
        held = _FEEDS.get(key)
        if held is not None and (held.feed.closed or held.feed.pid != os.getpid()):
            del _FEEDS[key]
            held = None
        if held is None:
            try:
                feed = ChangeFeed(workspace)
            except OSError:
                return None
            held = _FEEDS[key] = _Held(feed)
        held.users += 1
        return held.feed


def release(feed: ChangeFeed | None) -> None:
    """One user less; the feed lingers (LINGER_SECONDS) once nobody uses it."""
    if feed is None:
        return
    with _FEEDS_LOCK:
        held = _FEEDS.get(feed.root)
        if held is not None and held.feed is feed:
            held.users = max(0, held.users - 1)
            held.released_at = time.monotonic()
        _expire()


def active(workspace: str | os.PathLike) -> ChangeFeed | None:
    """The feed this process keeps for `workspace` (in use or lingering), or None."""
    held = _FEEDS.get(os.fsencode(os.path.realpath(workspace)))
    if held is None or held.feed.closed or held.feed.pid != os.getpid():
        return None
    return held.feed


def close_all() -> None:
    """Close every feed of this process (tests, shutdown)."""
    with _FEEDS_LOCK:
        for held in _FEEDS.values():
            held.feed.close()
        _FEEDS.clear()


def _expire() -> None:
    now = time.monotonic()
    idle = sorted((held.released_at, key) for key, held in _FEEDS.items() if held.users == 0)
    for n, (released_at, key) in enumerate(idle):
        if now - released_at > LINGER_SECONDS or len(idle) - n > MAX_IDLE_FEEDS:
            _FEEDS.pop(key).feed.close()


def _after_fork() -> None:
    # The child shares the parent's inotify descriptors: reading them would steal the parent's
    # events. Forget them without closing (each feed also checks its pid). A feed's thread does
    # not exist in the child, and may have held the feed's lock at the fork: give each a new one,
    # so a stray call in the child finds the feed closed to it instead of waiting forever.
    for held in _FEEDS.values():
        held.feed._lock = threading.Lock()
    _FEEDS.clear()


os.register_at_fork(after_in_child=_after_fork)


class _Follower:
    """One thread per process reads every published feed's inotify queue as events come (an
    epoll over their descriptors), so each feed's journal follows its workspace: a thread per
    feed cost a worker of 300 runs 300 threads, and select() cannot take a descriptor past
    1,024, which a busy worker's are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._feeds: dict[int, ChangeFeed] = {}
        self._epoll: select.epoll | None = None
        self._pid: int | None = None

    def follow(self, fd: int, feed: ChangeFeed) -> None:
        with self._lock:
            if self._pid != os.getpid():  # new here, or a forked child: its own thread
                self._feeds, self._pid = {}, os.getpid()
                self._epoll = select.epoll()
                threading.Thread(
                    target=self._run, args=(self._epoll,), name="change-feeds", daemon=True
                ).start()
            assert self._epoll is not None
            self._feeds[fd] = feed
            self._epoll.register(fd, select.EPOLLIN)

    def forget(self, fd: int) -> None:
        """Before the feed closes `fd` (a number the kernel may give out again at once)."""
        with self._lock:
            if self._pid == os.getpid() and self._feeds.pop(fd, None) is not None:
                with contextlib.suppress(OSError, ValueError):
                    self._epoll.unregister(fd)

    def _run(self, epoll: select.epoll) -> None:
        while True:
            try:
                ready = epoll.poll(5.0)
            except InterruptedError:
                continue
            for fd, _ in ready:
                with self._lock:
                    feed = self._feeds.get(fd)
                if feed is not None:
                    feed._follow(fd)


FOLLOWER = _Follower()
