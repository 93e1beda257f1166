"""Nothing committed is lost: each ended run's last committed workspace holds every write whose
result is on its live branch.

The soak's scripts write `work/fN.txt` (write_file) and append to `log.txt` (`echo turn N >>`).
Replaying those calls' results on the run's live branch (rewinds leave out what they abandoned)
gives what the workspace must hold. A call closed as interrupted, and an append whose command
failed, may or may not have had its effect, so either is accepted. A fork starts from another
run's history, so forks are left out."""

from __future__ import annotations

LOG = "log.txt"


def lost_writes(run_ids: list[int]) -> tuple[int, int, list[str]]:
    """(runs checked, runs whose workspace lost a committed write, what each lost)."""
    from agents import workspaces
    from agents.models import Checkpoint, Run

    checked, lost, losers = 0, [], set()
    snaps = workspaces.store()
    runs = Run.objects.filter(pk__in=run_ids, status="succeeded", forked_from__isnull=True)
    for run in runs:
        tree = (
            run.workspace_tree
            or Checkpoint.objects.filter(run=run).order_by("-seq").values_list("tree", flat=True)[0]
        )
        files = snaps.files(tree)
        checked += 1
        for problem in _problems(run.pk, files, lambda path, t=tree: snaps.read(t, path)):
            lost.append(f"run {run.pk}: {problem}")
            losers.add(run.pk)
    return checked, len(losers), lost


def _problems(run_id: int, files: dict, read) -> list[str]:
    writes, appends, maybe_appends = _expected(run_id)
    problems = []
    for path, allowed in sorted(writes.items()):
        entry = files.get(path)
        content = read(entry.path).decode() if entry is not None else None
        if content not in allowed:
            problems.append(f"{path} holds {_short(content)}, not {sorted(map(_short, allowed))}")
    entry = files.get(LOG)
    lines = read(entry.path).decode().splitlines() if entry is not None else []
    if not appends <= len(lines) <= appends + maybe_appends:
        problems.append(
            f"{LOG} has {len(lines)} lines; its committed appends make {appends}"
            + (
                f" (up to {appends + maybe_appends} with interrupted or failed ones)"
                if maybe_appends
                else ""
            )
        )
    return problems


def _expected(run_id: int) -> tuple[dict[str, set], int, int]:
    """What the live branch's results say the workspace holds: per written path, the contents
    it may hold; the appends to log.txt that happened, and those that may have."""
    from agents.models import Event
    from agents.runtime.conversation import INTERRUPTED

    live = Event.objects.on_live_branch(run_id).filter(kind__in=["tool.call", "tool.result"])
    calls: dict[str, dict] = {}
    writes: dict[str, set] = {}
    appends = maybe = 0
    for kind, payload in live.order_by("seq").values_list("kind", "payload"):
        if kind == "tool.call":
            calls[payload["tool_use_id"]] = payload
            continue
        call = calls.get(payload["tool_use_id"])
        if call is None:
            continue
        interrupted = payload.get("output") == INTERRUPTED
        given = call.get("input") or {}
        if call["name"] == "bash" and f">> {LOG}" in given.get("command", ""):
            # A command that failed may have appended first: killed by the disk watch as the
            # soak fills the disk, its `echo` done and its `wc` not (a denied one never ran).
            if interrupted or payload.get("is_error"):
                maybe += 1
            else:
                appends += 1
            continue
        if payload.get("is_error") and not interrupted:
            continue  # denied or failed: no effect
        if call["name"] == "write_file":
            path = given["path"]
            # An interrupted write may not have happened: what was there before stays allowed.
            before = writes.get(path, {None}) if interrupted else set()
            writes[path] = before | {given["content"]}
    return writes, appends, maybe


def _short(content: str | None) -> str:
    if content is None:
        return "nothing"
    return repr(content if len(content) < 40 else content[:40] + "...")
