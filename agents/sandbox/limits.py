"""Hard limits for one command, and the cgroups that enforce them and end every process it began.

Memory and the number of processes are limited through a cgroup per command when this machine
lets us make one (cgroup v2 with the controllers delegated, or a writable cgroup v1 hierarchy);
memory falls back to RLIMIT_AS (per process) otherwise. CPU seconds, file size and open files
are rlimits. A cgroup also holds every process the command started, whatever it did to get away
(`nohup ... &`, `setsid`, a double fork), so it can be killed whole: `cgroup.kill` on cgroup v2,
freeze + SIGKILL of every member on cgroup v1.

Per-command cgroups are made under a `shiftlog` folder in the worker's own cgroup, named
`cmd-<worker pid>-<worker start time>-<n>`: one whose worker is gone is stale (the worker was
killed mid-command) and `cleanup_stale_cgroups()` kills what is left in it and removes it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import itertools
import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

try:
    import inotify_simple
except ImportError:  # the waits below look every few milliseconds instead
    inotify_simple = None  # type: ignore[assignment]

MiB = 1024**2
GiB = 1024**3


@dataclass(frozen=True)
class Limits:
    """Per-command limits. None switches one off.

    memory_bytes: RAM (+ swap) of all the command's processes together, through a cgroup. Where
        there is none it becomes a per-process address-space limit (RLIMIT_AS) of 2 x the value.
    address_space_bytes: RLIMIT_AS applied as well when a cgroup limits memory: high enough for
        runtimes that reserve a lot of address space they never use (the JVM reserves a quarter of
        the machine's RAM, V8 and Go reserve arenas), low enough that an absurd allocation fails
        at once with an error instead of filling the cgroup.
    processes: processes and threads of the command together (pids cgroup).
    cpu_seconds: CPU time of each process (RLIMIT_CPU: SIGXCPU, then SIGKILL 5 s later).
    file_size: the largest file a command may write (RLIMIT_FSIZE).
    open_files: open file descriptors per process (RLIMIT_NOFILE).
    tmp_bytes: size of the private /tmp and HOME (bubblewrap only).
    workspace_bytes: the most the workspace may hold while the command runs (watched:
        agents/sandbox/diskwatch.py); the command is killed when it writes past it.
    min_free_bytes: the free space the command must leave on the workspace's filesystem (for the
        database and everything else there); the command is killed when it goes below.
    """

    memory_bytes: int | None = 2 * GiB
    address_space_bytes: int | None = 16 * GiB
    processes: int | None = 512
    cpu_seconds: int | None = 1800
    file_size: int | None = 2 * GiB
    open_files: int | None = 1024
    tmp_bytes: int | None = 1 * GiB
    workspace_bytes: int | None = None
    min_free_bytes: int | None = None


DEFAULT_LIMITS = Limits()

_NAME = re.compile(r"^cmd-(\d+)-(\d+)-(\d+)$")
_seq = itertools.count(1)


# --- what this machine offers ------------------------------------------------------------------
@dataclass(frozen=True)
class Hierarchy:
    """Our `shiftlog` folder in one mounted cgroup hierarchy."""

    version: int  # 1 or 2
    base: Path
    controllers: frozenset[str]


@dataclass(frozen=True)
class CgroupSupport:
    memory: Hierarchy | None = None
    pids: Hierarchy | None = None
    freezer: Hierarchy | None = None  # v1 freezer
    v2: Hierarchy | None = None  # for cgroup.kill, with or without controllers
    notes: tuple[str, ...] = ()

    @property
    def kill(self) -> str:
        """How a command's processes are all killed: the strongest mechanism available."""
        if self.v2 is not None and "kill" in self.v2.controllers:
            return "cgroup-v2"
        if self.freezer is not None:
            return "cgroup-v1-freezer"
        if self.memory is not None or self.pids is not None:
            return "cgroup-v1"
        return "none"

    def hierarchies(self) -> list[Hierarchy]:
        found: list[Hierarchy] = []
        for h in (self.v2, self.freezer, self.memory, self.pids):
            if h is not None and h not in found:
                found.append(h)
        return found


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of every cgroup mount."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3 or rfields[0] not in ("cgroup", "cgroup2"):
            continue
        root, point = fields[3], fields[4].replace("\\040", " ")
        found.append((rfields[0], root, point, set(rfields[2].split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller (or "" for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths[""] = parts[2]
        for controller in parts[1].split(","):
            if controller:
                paths[controller] = parts[2]
    return paths


def _own_dir(root: str, point: str, own: str) -> Path | None:
    root = root.rstrip("/") or "/"
    if root != "/" and not (own == root or own.startswith(root + "/")):
        return None  # our cgroup is outside what this mount shows (a cgroup namespace)
    rel = own[len(root) :] if root != "/" else own
    return Path(point + rel).resolve() if rel not in ("", "/") else Path(point)


def _write(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _make_base(own: Path) -> Path | None:
    base = own / "shiftlog"
    try:
        base.mkdir(exist_ok=True)
    except OSError:
        return None
    return base


def _v2(point: str, root: str, own: str, notes: list[str]) -> Hierarchy | None:
    own_dir = _own_dir(root, point, own)
    if own_dir is None:
        notes.append("cgroup v2: our cgroup is not visible in its mount")
        return None
    base = _make_base(own_dir)
    if base is None:
        notes.append(f"cgroup v2: cannot create {own_dir}/shiftlog (not delegated to us)")
        return None
    wanted = {"memory", "pids"}

    def controllers() -> set[str]:
        with contextlib.suppress(OSError):
            return set((base / "cgroup.controllers").read_text().split())
        return set()

    missing = wanted - controllers()
    if missing:
        # Fails (EBUSY) when our own cgroup holds processes and is not the root: then a
        # supervisor has to delegate a subtree to us, as systemd's Delegate=yes does.
        with contextlib.suppress(OSError):
            _write(own_dir / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(missing)))
    have = controllers() & wanted
    if have:
        with contextlib.suppress(OSError):
            _write(base / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(have)))
        with contextlib.suppress(OSError):
            have &= set((base / "cgroup.subtree_control").read_text().split())
    if wanted - have:
        notes.append(
            "cgroup v2: controllers " + ", ".join(sorted(wanted - have)) + " not delegated"
        )
    probe = base / f"probe-{os.getpid()}"
    try:
        probe.mkdir(exist_ok=True)
        killable = (probe / "cgroup.kill").exists()
        probe.rmdir()
    except OSError:
        killable = False
    if not killable:
        notes.append("cgroup v2: no cgroup.kill (kernel older than 5.14)")
        if not have:
            return None
    return Hierarchy(2, base, frozenset(have | ({"kill"} if killable else set())))


@functools.cache
def cgroup_support() -> CgroupSupport:
    """What cgroups this process can make for its commands. Probed once per process."""
    notes: list[str] = []
    own = _own_paths()
    memory = pids = freezer = v2 = None
    for fstype, root, point, opts in _mounts():
        if fstype == "cgroup2":
            if v2 is None and "" in own:
                v2 = _v2(point, root, own[""], notes)
            continue
        for controller in ("memory", "pids", "freezer"):
            if controller not in opts or controller not in own:
                continue
            own_dir = _own_dir(root, point, own[controller])
            base = _make_base(own_dir) if own_dir is not None else None
            if base is None:
                notes.append(f"cgroup v1 {controller}: not writable here")
                continue
            hierarchy = Hierarchy(1, base, frozenset({controller}))
            if controller == "memory":
                memory = hierarchy
            elif controller == "pids":
                pids = hierarchy
            else:
                freezer = hierarchy
    if v2 is not None and "memory" in v2.controllers:
        memory = v2
    if v2 is not None and "pids" in v2.controllers:
        pids = v2
    if not _mounts():
        notes.append("no cgroup file system mounted")
    return CgroupSupport(memory=memory, pids=pids, freezer=freezer, v2=v2, notes=tuple(notes))


def mechanisms(limits: Limits, support: CgroupSupport | None = None) -> dict[str, str]:
    """Which mechanism enforces each limit on this machine (what CommandResult.limits says)."""
    support = cgroup_support() if support is None else support
    out: dict[str, str] = {}
    if limits.memory_bytes is not None:
        if support.memory is not None:
            out["memory"] = f"cgroup-v{support.memory.version}"
        else:
            out["memory"] = "rlimit-as"
    if address_space_limit(limits, support) is not None:
        out["address_space"] = "rlimit"
    if limits.processes is not None:
        if support.pids is not None:
            out["processes"] = f"cgroup-v{support.pids.version}"
        elif os.geteuid() != 0:
            out["processes"] = "rlimit-nproc"
        else:
            out["processes"] = "none"  # RLIMIT_NPROC does not bind root
    for name in ("cpu_seconds", "file_size", "open_files"):
        if getattr(limits, name) is not None:
            out[name.removesuffix("_seconds")] = "rlimit"
    if limits.workspace_bytes:
        out["workspace"] = "watch"
    if limits.min_free_bytes:
        out["disk_free"] = "watch"
    out["kill"] = support.kill if support.hierarchies() else "process-group"
    return out


def address_space_limit(limits: Limits, support: CgroupSupport) -> int | None:
    if support.memory is None and limits.memory_bytes is not None:
        fallback = 2 * limits.memory_bytes
        if limits.address_space_bytes is not None:
            return min(fallback, limits.address_space_bytes)
        return fallback
    return limits.address_space_bytes


# --- one command's cgroups ---------------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _procs(folder: Path) -> list[int]:
    try:
        return [int(p) for p in (folder / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _signal_all(folder: Path, spare: int | None = None) -> None:
    for pid in _procs(folder):
        if pid == spare:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class CommandCgroup:
    """The cgroups of one command: made before it starts, joined by the child between fork and
    exec (join_paths), killed whole and removed when it is over."""

    limits: Limits
    support: CgroupSupport = field(default_factory=cgroup_support)
    folders: list[tuple[Hierarchy, Path]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The event counters when the current command began: a slot's cgroups (spawner.py) are
    # kept from one command to the next, and their counters only grow.
    baseline: dict[str, int] = field(default_factory=dict)
    # The baseline was read when the last command was over (exceeded()) and nothing has run in
    # the cgroups since: the next command need not read the counters again before it starts.
    fresh: bool = False
    extra_pids: int = 0  # processes in the cgroups that are not the command's (a fork server)

    def __post_init__(self) -> None:
        me = os.getpid()
        name = f"cmd-{me}-{_start_time(me) or 0}-{next(_seq)}"
        for hierarchy in self.support.hierarchies():
            folder = hierarchy.base / name
            try:
                folder.mkdir()
            except OSError as e:
                self.problems.append(f"{folder}: {e.strerror}")
                continue
            self.folders.append((hierarchy, folder))
        self._set_limits()
        self.mark()

    def _set_limits(self) -> None:
        lim = self.limits
        for hierarchy, folder in self.folders:
            settings: list[tuple[str, int | str]] = []
            if hierarchy is self.support.memory and lim.memory_bytes is not None:
                if hierarchy.version == 2:
                    settings += [("memory.max", lim.memory_bytes), ("memory.swap.max", 0)]
                else:
                    settings += [("memory.limit_in_bytes", lim.memory_bytes)]
                    # RAM + swap: no escape into swap where there is any.
                    if (folder / "memory.memsw.limit_in_bytes").exists():
                        settings += [("memory.memsw.limit_in_bytes", lim.memory_bytes)]
            if hierarchy is self.support.pids and lim.processes is not None:
                settings += [("pids.max", lim.processes + self.extra_pids)]
            for file, value in settings:
                try:
                    _write(folder / file, str(value))
                except OSError as e:
                    if file != "memory.swap.max":  # absent without swap accounting
                        self.problems.append(f"{folder / file}: {e.strerror}")

    @property
    def join_paths(self) -> list[str]:
        return [str(folder / "cgroup.procs") for _, folder in self.folders]

    def pids(self, spare: int | None = None) -> list[int]:
        seen: set[int] = set()
        for _, folder in self.folders:
            seen.update(_procs(folder))
        seen.discard(spare)  # type: ignore[arg-type]
        return sorted(seen)

    def kill(self, spare: int | None = None) -> None:
        """SIGKILL every process in the cgroups but `spare` (see wait_empty). With a spare, the
        members are first simply signalled (a command's last processes, still exiting, are
        usually all there is); if that does not empty the cgroups at once they are frozen where
        there is a freezer and killed; without one, `cgroup.kill` ends the spare too (the
        caller sees it gone)."""
        if spare is not None:
            for _, folder in self.folders:
                _signal_all(folder, spare)
            if self.wait_empty(0.02, spare=spare, resignal=False):
                return
        frozen = self._freeze() if spare is not None else None
        if frozen is None:
            for hierarchy, folder in self.folders:
                if hierarchy.version == 2 and "kill" in hierarchy.controllers:
                    with contextlib.suppress(OSError):
                        _write(folder / "cgroup.kill", "1")
                        return
            frozen = self._freeze()
        for _, folder in self.folders:
            _signal_all(folder, spare)
        if frozen is not None:
            with contextlib.suppress(OSError):
                _write(frozen / "freezer.state", "THAWED")

    def wait_empty(
        self, within: float = 5.0, spare: int | None = None, *, resignal: bool = True
    ) -> bool:
        """Wait until no process but `spare` is left in the cgroups, killing late forks. True
        when empty. Without a spare, woken by the v2 cgroup's `cgroup.events` (inotify) where
        there is one; else looked at after 0.2 ms, then less often (at most every 5 ms)."""
        deadline = time.monotonic() + within
        events = self._events_watch() if spare is None else None
        try:
            pause = 0.0002
            while self.pids(spare):
                if time.monotonic() >= deadline:
                    return False
                for _, folder in self.folders if resignal else ():
                    _signal_all(folder, spare)  # a fork that raced the first round
                if events is not None:
                    events.read(timeout=max(1, int(pause * 1000)))
                else:
                    time.sleep(pause)
                pause = min(pause * 2, 0.005)
            return True
        finally:
            if events is not None:
                events.close()

    def _events_watch(self):
        """An inotify on the v2 folder's cgroup.events (changes when it empties), or None."""
        for hierarchy, folder in self.folders:
            if hierarchy.version == 2:
                if inotify_simple is None:
                    return None
                try:
                    watch = inotify_simple.INotify()
                    watch.add_watch(str(folder / "cgroup.events"), inotify_simple.flags.MODIFY)
                    return watch
                except OSError:
                    return None
        return None

    def _freeze(self) -> Path | None:
        """Freeze the v1 freezer cgroup so no member can fork while we kill them."""
        for hierarchy, folder in self.folders:
            if hierarchy is self.support.freezer:
                try:
                    _write(folder / "freezer.state", "FROZEN")
                except OSError:
                    return None
                deadline = time.monotonic() + 1.0
                while time.monotonic() < deadline:
                    with contextlib.suppress(OSError):
                        if (folder / "freezer.state").read_text().strip() == "FROZEN":
                            break
                    time.sleep(0.002)
                return folder
        return None

    def _counters(self) -> dict[str, int]:
        found = {}
        for hierarchy, folder in self.folders:
            if hierarchy is self.support.memory:
                file = "memory.events" if hierarchy.version == 2 else "memory.oom_control"
                found["memory"] = _counter(folder / file, "oom_kill")
            if hierarchy is self.support.pids:
                found["processes"] = _counter(folder / "pids.events", "max")
        return found

    def mark(self) -> None:
        """A command begins: what bits from now on is its own."""
        if not self.fresh:
            self.baseline = self._counters()
        self.fresh = False

    def exceeded(self) -> list[str]:
        """The limits that bit since mark(): "memory" (the OOM killer killed a process),
        "processes" (a fork was refused at the limit). Also the next command's baseline."""
        now = self._counters()
        bit = [name for name, count in now.items() if count > self.baseline.get(name, 0)]
        self.baseline, self.fresh = now, True
        return bit

    def remove(self) -> None:
        for _, folder in self.folders:
            _rmdir(folder)
        self.folders = []


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _rmdir(folder: Path, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while True:
        try:
            folder.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() >= deadline:
                return False
            _signal_all(folder)
            time.sleep(0.01)


def cleanup_stale_cgroups() -> int:
    """Kill what is left in, and remove, per-command cgroups whose worker is gone (it was killed
    mid-command). Safe to call from any worker at any time; returns how many were removed."""
    support = cgroup_support()
    removed = 0
    for hierarchy in support.hierarchies():
        try:
            names = os.listdir(hierarchy.base)
        except OSError:
            continue
        for name in names:
            match = _NAME.match(name)
            if not match:
                continue
            pid, started = int(match[1]), match[2]
            if _start_time(pid) == started:
                continue  # its worker still runs: not ours to touch
            folder = hierarchy.base / name
            if hierarchy.version == 2 and "kill" in hierarchy.controllers:
                with contextlib.suppress(OSError):
                    _write(folder / "cgroup.kill", "1")
            _signal_all(folder)
            if _rmdir(folder):
                removed += 1
    return removed
