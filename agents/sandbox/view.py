"""The filesystem a sandboxed command sees: an allow-list of folders, never the host's `/`.

`build_view()` returns the bubblewrap arguments (everything before the command). The rule is
"nothing is visible unless it is listed here", so a new secret on the host (a key file in /etc, a
data folder moved somewhere else, another project's checkout) stays hidden without anyone
remembering to hide it:

- read-only: /usr (and the /bin, /sbin, /lib* links or folders next to it), a vetted list of
  /etc entries (ETC_ALLOWED: name service, loader, certificates, locale and tool configuration;
  never shadow, gshadow, sudoers, ssh keys, ssl/private, pip.conf or npmrc, which can hold
  credentials; commands see a copy of exactly those entries, etc_copy()), and the toolchain folders the run is configured to use (by default the base
  interpreter's prefix, never Shiftlog's own virtualenv or source);
- read-write: the run's workspace, at the same path as on the host;
- private and empty at every command: /tmp and HOME (/home/agent), both size-capped tmpfs;
- fresh: /proc of the command's own PID namespace, a minimal /dev;
- everything else (the data folder with the database, secret key, queue, blobs and other runs'
  workspaces, the project source, /root, /home, /var, /run, /sys, the host's /proc) does not
  exist inside: a path there gives ENOENT, not EACCES.

The command runs as uid 1000 ("agent") of a user namespace with every capability dropped, in new
PID, IPC, UTS and cgroup namespaces and a new network namespace (or, with egress, the run's own:
relay.RunNet), and dies with its parent.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)

HOME = "/home/agent"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
# Where an egress proxy's socket appears inside the sandbox (see egress.py).
EGRESS_DIR = "/run/shiftlog"
BASE_PATH = "/usr/local/bin:/usr/bin:/bin"

# /etc entries a command may read. An allow-list, so a secret added to /etc later stays hidden.
ETC_ALLOWED: tuple[str, ...] = (
    "alternatives",  # /usr/bin/awk and friends are links through here
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "hostname",
    "hosts",
    "inputrc",
    "java-17-openjdk",
    "java-21-openjdk",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "nsswitch.conf",
    "os-release",
    "perl",
    "profile",
    "protocols",
    "python3",
    "python3.11",
    "python3.12",
    "python3.13",
    "services",
    "shells",
    "ssl/certs",  # public CA certificates only; never ssl/private
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
)

# The sandbox's own user database: the host's /etc/passwd lists the host's accounts, and none
# of them is uid 1000 "agent".
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    f"agent:x:{SANDBOX_UID}:{SANDBOX_GID}:agent:{HOME}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nagent:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"

_SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# How often the copy of /etc (etc_copy) is compared with the host's /etc again.
ETC_RECHECK_S = 30.0
_ETC_ROOT = "/etc"  # (tests copy a folder of their own)


def default_toolchain() -> list[str]:
    """The base interpreter's prefix: the Python the worker was built on, without its venv."""
    return [sys.base_prefix]


def toolchain_folders(toolchain: Sequence[str] | None) -> list[str]:
    """The folders to bind for a toolchain: each one given, plus the base prefix of any
    virtualenv among them (its python is a link into that base)."""
    folders: list[str] = []
    for folder in default_toolchain() if toolchain is None else toolchain:
        folder = os.path.abspath(folder)
        if folder not in folders:
            folders.append(folder)
        cfg = Path(folder, "pyvenv.cfg")
        if cfg.is_file():
            for line in cfg.read_text(errors="replace").splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "home" and value.strip():
                    base = os.path.dirname(os.path.abspath(value.strip()))
                    if base not in folders:
                        folders.append(base)
    return folders


def _covered(path: str) -> bool:
    """True when `path` is inside a folder the view binds anyway (/usr)."""
    return path == "/usr" or path.startswith("/usr/")


def toolchain_path(toolchain: Sequence[str] | None) -> str:
    """PATH for a command: each toolchain folder's bin (when it has one), then the system's."""
    bins = []
    for folder in toolchain_folders(toolchain):
        bin_dir = os.path.join(folder, "bin")
        if os.path.isdir(bin_dir) and bin_dir not in bins and bin_dir not in BASE_PATH.split(":"):
            bins.append(bin_dir)
    return ":".join([*bins, BASE_PATH])


def _ro_bind(src: str, dest: str | None = None) -> list[str]:
    return ["--ro-bind", src, dest or src]


def build_view(
    workspace: str | os.PathLike[str],
    *,
    bwrap: str = "bwrap",
    toolchain: Sequence[str] | None = None,
    env: dict[str, str] | None = None,
    etc: Sequence[str] = ETC_ALLOWED,
    egress_socket_dir: str | None = None,
    tmp_bytes: int | None = None,
    passwd_fd: int | None = None,
    group_fd: int | None = None,
    writable: Sequence[str] = (),
    share_net: bool = False,
    etc_folder: str | None = None,
) -> list[str]:
    """The bwrap argv (up to, not including, the command) that shows a command only what it needs.

    `toolchain`: read-only folders of the interpreters and tools the run uses (default: the base
    interpreter's prefix). `env`: the command's whole environment (bwrap starts from an empty
    one). `egress_socket_dir`: a folder holding the egress proxy's socket, shown read-only at
    EGRESS_DIR. `passwd_fd`/`group_fd`: readable fds with PASSWD/GROUP (see user_db_fds()); the
    caller passes them to the child (pass_fds) and closes them after the start. `writable`:
    folders outside the workspace shown read-write at their own path (a check's report folder).
    With `etc_folder`, which holds PASSWD and GROUP, `passwd_fd`/`group_fd` are not used.
    `share_net`: keep the network namespace bwrap is started in (the run's, which its starter
    joined: relay.RunNet) instead of a new empty one. `etc_folder`: a copy of the allowed /etc
    entries (etc_copy()) shown read-only as /etc in one mount, instead of one mount per entry.
    """
    ws = os.path.realpath(workspace)
    argv = [bwrap]
    # Namespaces: user (uid 1000, no capabilities), pid, net, ipc, uts, cgroup.
    argv += [
        "--unshare-all",
        *(["--share-net"] if share_net else []),
        "--unshare-user",
        "--uid",
        str(SANDBOX_UID),
        "--gid",
        str(SANDBOX_GID),
    ]
    argv += ["--cap-drop", "ALL", "--die-with-parent", "--new-session", "--clearenv"]

    argv += _ro_bind("/usr")
    for link in _SYSTEM_LINKS:
        if os.path.islink(link):
            argv += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            argv += _ro_bind(link)

    if etc_folder is not None:
        argv += _ro_bind(etc_folder, "/etc")
    else:
        argv += ["--perms", "0755", "--dir", "/etc"]
        for name in etc:
            path = os.path.join("/etc", name)
            if os.path.lexists(path):
                if os.path.islink(path) and not os.path.exists(os.path.realpath(path)):
                    continue  # a dangling link would make bwrap fail
                argv += _ro_bind(path)
    if passwd_fd is not None and etc_folder is None:
        argv += ["--perms", "0644", "--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    if group_fd is not None and etc_folder is None:
        argv += ["--perms", "0644", "--ro-bind-data", str(group_fd), "/etc/group"]

    argv += ["--dev", "/dev", "--proc", "/proc"]
    size = ["--size", str(tmp_bytes)] if tmp_bytes else []
    argv += [*size, "--tmpfs", "/tmp", "--perms", "0755", "--dir", "/home"]
    argv += [*size, "--tmpfs", HOME]

    # After the tmpfs mounts, so a toolchain or workspace living under /tmp is not hidden.
    for folder in toolchain_folders(toolchain):
        if _covered(folder) or not os.path.isdir(folder):
            continue
        real = os.path.realpath(folder)
        argv += _ro_bind(real, folder)
        if real != folder and not _covered(real):
            argv += _ro_bind(real)
    for folder in writable:
        argv += ["--bind", os.path.realpath(folder), folder]
    if egress_socket_dir is not None:
        argv += _ro_bind(os.path.realpath(egress_socket_dir), EGRESS_DIR)
    argv += ["--bind", ws, ws, "--chdir", ws]
    # The mount points bwrap made on its root tmpfs (/etc, the workspace's parents, ...) are
    # read-only too: nothing written outside the workspace, /tmp and HOME survives or is shared.
    argv += ["--remount-ro", "/"]
    for key, value in (env or {}).items():
        argv += ["--setenv", key, value]
    return argv


def user_db_fds() -> tuple[int, int]:
    """Two pipes' read ends holding PASSWD and GROUP (small: they fit the pipe buffer)."""
    fds = []
    for text in (PASSWD, GROUP):
        read_end, write_end = os.pipe()
        os.write(write_end, text.encode())
        os.close(write_end)
        fds.append(read_end)
    return fds[0], fds[1]


# --- /etc in one mount ---------------------------------------------------------------------------
# bubblewrap spends about 0.1 ms on each read-only bind (it remounts every one and reads the
# mount table each time): the ~37 entries of ETC_ALLOWED were half of a command's start. So a
# copy of exactly those entries is made once (a top-level link is copied as what it points to,
# as a bind of it shows; links inside folders stay links, as under a bind) and bound as /etc.
# It is compared with the host's /etc at most every ETC_RECHECK_S seconds (names, sizes, times,
# inodes of every file under the entries) and made again when anything differs. Copies live in
# a folder of this user's own (0700), named by that fingerprint, shared by the workers of the
# machine; one that cannot be made leaves the per-entry binds.


class _EtcCopy:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: tuple[str, ...] = ()
        self.folder: str | None = None
        self.checked = 0.0
        self.failed = 0.0


_ETC = _EtcCopy()


def _etc_base() -> Path:
    root = "/var/tmp" if os.path.isdir("/var/tmp") else tempfile.gettempdir()
    return Path(root, f"shiftlog-etc-{os.geteuid()}")


def _own_private_dir(path: Path) -> bool:
    """`path` is a real folder of this user's that no one else may write (made if missing)."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    return (
        not path.is_symlink()
        and path.is_dir()
        and st.st_uid == os.geteuid()
        and st.st_mode & 0o022 == 0
    )


def _etc_fingerprint(etc: Sequence[str]) -> str:
    digest = hashlib.sha256(f"{PASSWD}\0{GROUP}\0".encode())
    for name in etc:
        path = os.path.join(_ETC_ROOT, name)
        try:
            st = os.stat(path)  # a top-level link is copied as what it points to
        except OSError:
            digest.update(f"{name}\0-\n".encode())
            continue
        digest.update(
            f"{name}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode()
        )
        if not os.path.isdir(path):
            continue
        for folder, dirs, files in os.walk(path):
            dirs.sort()
            for entry in sorted(dirs + files):
                full = os.path.join(folder, entry)
                try:
                    sub = os.lstat(full)
                    link = os.readlink(full) if os.path.islink(full) else ""
                except OSError:
                    continue
                digest.update(
                    f"{full}\0{sub.st_mode}\0{sub.st_size}\0{sub.st_mtime_ns}\0{sub.st_ino}"
                    f"\0{link}\n".encode()
                )
    return digest.hexdigest()[:32]


def _make_etc_copy(etc: Sequence[str], base: Path, fingerprint: str) -> Path:
    final = base / fingerprint
    if final.is_dir():
        return final
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=base))
    try:
        for name in etc:
            source = os.path.join(_ETC_ROOT, name)
            if not os.path.exists(source):  # missing, or a dangling link: not shown
                continue
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if os.path.isdir(source):
                shutil.copytree(os.path.realpath(source), target, symlinks=True)
            else:
                shutil.copy2(source, target)
        # The sandbox's own user database.
        for name, text in (("passwd", PASSWD), ("group", GROUP)):
            (work / name).write_text(text)
            os.chmod(work / name, 0o644)
        os.chmod(work, 0o755)
        try:
            os.rename(work, final)
        except OSError:  # another worker made the same copy meanwhile
            if not final.is_dir():
                raise
            shutil.rmtree(work, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    # Copies of an /etc long gone (not this one, untouched for a day) are removed.
    for old in base.iterdir():
        with contextlib.suppress(OSError):
            if old != final and time.time() - old.lstat().st_mtime > 86400:
                shutil.rmtree(old)
    return final


def etc_copy(etc: Sequence[str] = ETC_ALLOWED) -> str | None:
    """The folder to bind as /etc (see above), or None: bind the entries one by one."""
    entries = tuple(etc)
    now = time.monotonic()
    with _ETC.lock:
        fresh = (
            _ETC.folder is not None
            and _ETC.entries == entries
            and now - _ETC.checked < ETC_RECHECK_S
        )
        if fresh and os.path.isdir(_ETC.folder):  # (a cleaner may have removed it)
            return _ETC.folder
        if now - _ETC.failed < ETC_RECHECK_S:
            return None
        try:
            base = _etc_base()
            if not _own_private_dir(base):
                raise OSError(f"{base} is not a private folder of this user's")
            folder = str(_make_etc_copy(entries, base, _etc_fingerprint(entries)))
        except OSError as e:
            log.warning("sandbox: no copy of /etc (%s); binding its entries one by one", e)
            _ETC.folder, _ETC.failed = None, now
            return None
        _ETC.entries, _ETC.folder, _ETC.checked = entries, folder, now
        return folder
