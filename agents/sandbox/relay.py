"""The relay that lets a sandboxed command reach the egress proxy although it has no network.

Inside the sandbox's own network namespace only a loopback interface exists. Before the command
runs, the toolchain's python3 runs RELAY_CODE: it listens on 127.0.0.1:RELAY_PORT (in the
sandbox's loopback), forks into the background once it listens (so the command never races it)
and forwards each connection to the proxy's Unix socket, which is bound into the sandbox. The
relay dies with the sandbox's PID namespace when the command ends.

Python rather than socat: the toolchain's python3 is in every sandbox (socat is not installed
everywhere), and forking after listen() makes "ready" exact without polling.
"""

from __future__ import annotations

RELAY_PORT = 3128
SOCKET_NAME = "egress.sock"

RELAY_CODE = r"""
import os, socket, sys, threading
path, port = sys.argv[1], int(sys.argv[2])
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", port))
server.listen(128)
if os.fork():
    os._exit(0)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)

def pump(src, dst):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass

def serve(client):
    upstream = socket.socket(socket.AF_UNIX)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    other = threading.Thread(target=pump, args=(client, upstream), daemon=True)
    other.start()
    pump(upstream, client)
    other.join()
    client.close()
    upstream.close()

while True:
    client, _ = server.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
"""


def proxy_env(port: int = RELAY_PORT) -> dict[str, str]:
    """Environment that points HTTP clients (curl, pip, git, npm, urllib, requests) at the relay."""
    url = f"http://127.0.0.1:{port}"
    env = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
        env[name] = env[name.lower()] = url
    # The sandbox's own loopback (servers a command starts itself) is reached directly.
    env["NO_PROXY"] = env["no_proxy"] = "localhost,127.0.0.1,::1"
    return env
