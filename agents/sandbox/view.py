"""The filesystem a sandboxed command sees: an allow-list of folders, never the host's `/`.

`build_view()` returns the bubblewrap arguments (everything before the command). The rule is
"nothing is visible unless it is listed here", so a new secret on the host (a key file in /etc, a
data folder moved somewhere else, another project's checkout) stays hidden without anyone
remembering to hide it:

- read-only: /usr (and the /bin, /sbin, /lib* links or folders next to it), a vetted list of
  /etc entries (ETC_ALLOWED: name service, loader, certificates, locale and tool configuration;
  never shadow, gshadow, sudoers, ssh keys, ssl/private, pip.conf or npmrc, which can hold
  credentials), and the toolchain folders the run is configured to use (by default the base
  interpreter's prefix, never Shiftlog's own virtualenv or source);
- read-write: the run's workspace, at the same path as on the host;
- private and empty at every command: /tmp and HOME (/home/agent), both size-capped tmpfs;
- fresh: /proc of the command's own PID namespace, a minimal /dev;
- everything else (the data folder with the database, secret key, queue, blobs and other runs'
  workspaces, the project source, /root, /home, /var, /run, /sys, the host's /proc) does not
  exist inside: a path there gives ENOENT, not EACCES.

The command runs as uid 1000 ("agent") of a user namespace with every capability dropped, in new
PID, network, IPC, UTS and cgroup namespaces, and dies with its parent.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

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
) -> list[str]:
    """The bwrap argv (up to, not including, the command) that shows a command only what it needs.

    `toolchain`: read-only folders of the interpreters and tools the run uses (default: the base
    interpreter's prefix). `env`: the command's whole environment (bwrap starts from an empty
    one). `egress_socket_dir`: a folder holding the egress proxy's socket, shown read-only at
    EGRESS_DIR. `passwd_fd`/`group_fd`: readable fds with PASSWD/GROUP (see user_db_fds()); the
    caller passes them to the child (pass_fds) and closes them after the start. `writable`:
    folders outside the workspace shown read-write at their own path (a check's report folder).
    """
    ws = os.path.realpath(workspace)
    argv = [bwrap]
    # Namespaces: user (uid 1000, no capabilities), pid, net, ipc, uts, cgroup.
    argv += [
        "--unshare-all",
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

    argv += ["--perms", "0755", "--dir", "/etc"]
    for name in etc:
        path = os.path.join("/etc", name)
        if os.path.lexists(path):
            if os.path.islink(path) and not os.path.exists(os.path.realpath(path)):
                continue  # a dangling link would make bwrap fail
            argv += _ro_bind(path)
    if passwd_fd is not None:
        argv += ["--perms", "0644", "--ro-bind-data", str(passwd_fd), "/etc/passwd"]
    if group_fd is not None:
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
