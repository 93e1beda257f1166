"""The dashboard's pages. Views stay thin: access in dashboard.access, actions in agents.services
and agents.approvals, fragments in the page templates' partials (the WebSocket pushes the same)."""

from __future__ import annotations

import mimetypes

from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.tokens import default_token_generator
from django.core.paginator import Paginator
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents import approvals, checkpoints, services
from agents.blobstore import BlobStore
from agents.models import (
    Approval,
    ApprovalStatus,
    Artifact,
    Checkpoint,
    Event,
    Provider,
    Run,
    RunStatus,
    Session,
)
from agents.providers.scripted import builtin_script
from dashboard import access, stream
from dashboard.forms import NewRunForm, PolicyForm

RUNS_PER_PAGE = 25
TEXT_VIEW_LIMIT = 1_000_000
INLINE_IMAGES = {"image/png", "image/jpeg", "image/gif", "image/webp"}  # never SVG: it runs script


# --- queries ---------------------------------------------------------------------------------
def runs_for_list(qs):
    """Runs with what the list shows, in one query: subqueries on indexed columns, no per-row
    lookups (the latest event comes from the (run, seq) index, not a scan of the log)."""
    latest = Event.objects.filter(run=OuterRef("pk")).order_by("-seq").values("created_at")[:1]
    session = Session.objects.filter(run=OuterRef("pk")).order_by("-index").values("index")[:1]
    pending = (
        Approval.objects.filter(run=OuterRef("pk"), status=ApprovalStatus.PENDING)
        .order_by()
        .values("run")
        .annotate(n=Count("pk"))
        .values("n")
    )
    return (
        qs.select_related("created_by")
        .annotate(
            last_activity=Subquery(latest),
            current_session=Subquery(session),
            pending_approvals=Coalesce(Subquery(pending, output_field=IntegerField()), 0),
        )
        .order_by("-created_at", "-pk")
    )


def run_row(run_id: int) -> Run | None:
    return runs_for_list(Run.objects.filter(pk=run_id)).first()


def pending_approvals(user):
    return (
        access.visible_approvals(user)
        .filter(status=ApprovalStatus.PENDING)
        .select_related("run", "decided_by")
        .order_by("created_at", "pk")
    )


def meters(run: Run, sessions_used: int) -> list[dict]:
    def meter(label, used, limit, shown_used, shown_limit):
        pct = min(100, round(100 * float(used) / float(limit))) if limit else None
        level = "" if pct is None else "over" if pct >= 100 else "warn" if pct >= 80 else ""
        return {
            "label": label,
            "used": shown_used,
            "limit": shown_limit if limit else "no limit",
            "pct": pct,
            "level": level,
        }

    return [
        meter("Tokens", run.total_tokens, run.max_tokens, f"{run.total_tokens:,}",
              f"{run.max_tokens or 0:,}"),
        meter("Cost", run.cost_usd, run.max_cost_usd, f"${run.cost_usd:.4f}",
              f"${run.max_cost_usd or 0:.2f}"),
        meter("Sessions", sessions_used, run.max_sessions, str(sessions_used),
              str(run.max_sessions)),
        meter("Wall time", run.active_seconds, run.max_wall_seconds,
              f"{run.active_seconds:.0f} s", f"{run.max_wall_seconds} s"),
    ]  # fmt: skip


# The run page's panels, as template partials; a socket re-renders only those an event changes.
PANELS = ("run-header", "meters", "sessions", "checkpoints", "artifacts")
# The side panels show this many of the newest items (all with ?all=1): a run with thousands of
# sessions and checkpoints opens, and is pushed to, as fast as a new one.
PANEL_ITEMS = 25


def detail_context(
    user,
    run: Run,
    *,
    rights: access.Rights | None = None,
    panels: tuple[str, ...] = PANELS,
    everything: bool = False,
) -> dict:
    """What the run page's panels need (all, or those named), except the events; a handful of
    queries whatever the run's history."""
    limit = None if everything else PANEL_ITEMS
    context: dict = {"run": run, "rights": rights or access.Rights.of(user, run)}
    if "meters" in panels or "sessions" in panels:
        if "sessions" in panels:
            sessions, hidden = first_n(Session.objects.filter(run=run).order_by("-index"), limit)
            total = len(sessions[:limit]) + hidden
            context.update({"sessions": sessions[:limit][::-1], "sessions_hidden": hidden})
        else:
            total = Session.objects.filter(run=run).count()
        context["meters"] = meters(run, total)
    if "checkpoints" in panels:
        context["abandoned_ranges"] = checkpoints.abandoned_ranges(run.pk)
        items, hidden = first_n(
            Checkpoint.objects.filter(run=run).select_related("session").order_by("-seq", "-pk"),
            limit,
        )
        context["checkpoints"] = timeline(run, items, context["abandoned_ranges"])[:limit]
        context["checkpoints_hidden"] = hidden
    if "artifacts" in panels:
        artifacts, hidden = first_n(Artifact.objects.filter(run=run).order_by("-seq", "-pk"), limit)
        context.update({"artifacts": artifacts[:limit], "artifacts_hidden": hidden})
    return context


def first_n(qs, limit: int | None) -> tuple[list, int]:
    """The first `limit` rows of an ordered queryset (all with None), plus the next one when
    there is one (the timeline's "diff with previous" needs it), and how many rows are left
    out: one query, and a count only when the list is cut."""
    if limit is None:
        return list(qs), 0
    rows = list(qs[: limit + 1])
    return rows, (qs.count() - limit if len(rows) > limit else 0)


def timeline(run: Run, items: list[Checkpoint], ranges: list[tuple[int, int]]) -> list:
    """Checkpoints, newest first, each with what the timeline shows: the checkpoint before it
    (for "diff with previous"), whether a rewind abandoned it, its usage and its checks."""
    for i, c in enumerate(items):
        c.previous = items[i + 1] if i + 1 < len(items) else None
        c.abandoned = stream.in_ranges(c.seq, ranges)
        c.is_head = c.pk == run.head_checkpoint_id
        usage = c.usage or {}
        c.tokens = int(usage.get("total_tokens") or 0)
        c.cost = usage.get("cost_usd") or "0"
        c.turns = usage.get("turns") or 0
        c.checks = (c.state or {}).get("checks") or {}
        c.checks_passing = sum(1 for r in c.checks.values() if r.get("passed"))
    return items


# --- pages -----------------------------------------------------------------------------------
@login_required
@require_GET
def runs(request: HttpRequest) -> HttpResponse:
    qs = access.visible_runs(request.user)
    status = request.GET.get("status", "")
    if status in RunStatus.values:
        qs = qs.filter(status=status)
    else:
        status = ""
    q = request.GET.get("q", "").strip()
    if q:
        qs = qs.filter(goal__icontains=q)
    page = Paginator(runs_for_list(qs), RUNS_PER_PAGE).get_page(request.GET.get("page"))
    context = {
        "page": page,
        "status": status,
        "q": q,
        "statuses": RunStatus.choices,
        "live_new_rows": page.number == 1 and not q,
    }
    template = "runs/list.html#run-table" if request.htmx else "runs/list.html"
    return render(request, template, context)


@login_required
@require_http_methods(["GET", "POST"])
def new_run(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        form = NewRunForm.demo() if request.GET.get("demo") else NewRunForm()
        return render(request, "runs/new.html", {"form": form})
    form = NewRunForm(request.POST, request.FILES)
    if form.is_valid():
        data = form.cleaned_data
        script, script_name = data["script"], ""
        if data["provider"] == Provider.SCRIPTED:
            if script is None:
                script, script_name = _demo_script(), "demo (built in)"
            else:
                script_name = request.FILES["script"].name[:200]
        try:
            run = services.create_run(
                goal=data["goal"],
                checks=data["checks"],
                provider=data["provider"],
                script=script,
                script_name=script_name,
                model=data["model"] or None,
                budgets=services.Budgets(
                    max_sessions=data["max_sessions"],
                    max_tokens=data["max_tokens"],
                    max_cost_usd=data["max_cost_usd"],
                    max_wall_seconds=data["max_wall_seconds"],
                ),
                max_turns_per_session=data["max_turns_per_session"],
                tool_policy=data["tool_policy"],
                created_by=request.user,
            )
        except services.RunError as e:
            field = e.field if e.field in form.fields else None
            form.add_error(field, str(e))
        else:
            return redirect("run-detail", run_id=run.pk)
    return render(request, "runs/new.html", {"form": form}, status=400)


def _demo_script() -> dict:
    from django.conf import settings

    script = builtin_script("demo")
    script["turn_delay_seconds"] = settings.SHIFTLOG["DEMO_TURN_DELAY_SECONDS"]
    return script


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    context = detail_context(request.user, run, everything=request.GET.get("all") == "1")
    rows = stream.mark_abandoned(stream.newest(run.pk), context["abandoned_ranges"])
    context.update(
        {
            "rows": rows,
            "oldest_seq": rows[0].seq if rows else None,
            "has_older": bool(rows) and rows[0].seq > 1,
            "last_seq": rows[-1].seq if rows else 0,
            "policy_form": PolicyForm(initial={"rules": _json(run.tool_policy)}),
        }
    )
    return render(request, "runs/detail.html", context)


def _json(value) -> str:
    import json

    return json.dumps(value, indent=2)


@login_required
@require_GET
def run_events(request: HttpRequest, run_id: int) -> HttpResponse:
    """Older events, for scrolling back: a page of rows and the next "older" marker."""
    run = access.get_run_for_user(request.user, run_id)
    try:
        before = int(request.GET["before"])
    except (KeyError, ValueError):
        raise Http404("before=SEQ is required") from None
    rows = stream.mark_abandoned(
        stream.newest(run.pk, before=before), checkpoints.abandoned_ranges(run.pk)
    )
    context = {
        "run": run,
        "rights": access.Rights.of(request.user, run),
        "rows": rows,
        "oldest_seq": rows[0].seq if rows else None,
        "has_older": bool(rows) and rows[0].seq > 1,
    }
    return render(request, "runs/detail.html#older-events", context)


def _header_response(request, run: Run, *, error: str = "", notice: str = "") -> HttpResponse:
    if not request.htmx:
        if error:
            messages.error(request, error)
        elif notice:
            messages.success(request, notice)
        return redirect("run-detail", run_id=run.pk)
    run.refresh_from_db()
    context = detail_context(request.user, run, panels=("run-header",))
    context.update({"error": error, "notice": notice})
    return render(request, "runs/detail.html#run-header", context)


@login_required
@require_POST
def run_control(request: HttpRequest, run_id: int, action: str) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    actor = services.actor_for(request.user)
    try:
        if action == "pause":
            services.pause_run(run.pk, actor=actor)
        elif action == "resume":
            services.resume_run(run.pk, actor=actor, budgets=_raised(request))
        elif action == "cancel":
            services.cancel_run(run.pk, actor=actor)
        else:
            raise Http404("no such action")
    except services.RunError as e:
        return _header_response(request, run, error=str(e))
    return _header_response(request, run, notice=f"run {run.pk}: {action} done")


def _raised(request) -> services.Budgets | None:
    fields = ("max_sessions", "max_tokens", "max_cost_usd", "max_wall_seconds")
    values = {f: request.POST.get(f, "").strip() or None for f in fields}
    if not any(values.values()):
        return None
    try:
        for f in ("max_sessions", "max_tokens", "max_wall_seconds"):
            if values[f] is not None:
                values[f] = int(values[f])
    except ValueError:
        raise services.RunError("budgets must be whole numbers") from None
    return services.Budgets(**values)


@login_required
@require_POST
def run_note(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    try:
        services.note_run(
            run.pk, request.POST.get("text", ""), actor=services.actor_for(request.user)
        )
    except services.RunError as e:
        return _header_response(request, run, error=str(e))
    return _header_response(request, run, notice="note sent: the agent reads it at its next turn")


@login_required
@require_POST
def run_policy(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_controllable_run(request.user, run_id)
    form = PolicyForm(request.POST)
    saved = False
    if form.is_valid():
        try:
            approvals.set_policy(
                run.pk,
                form.cleaned_data["rules"],
                actor=services.actor_for(request.user),
                because="changed in the dashboard",
            )
            saved = True
        except approvals.ApprovalError as e:
            form.add_error("rules", str(e))
    run.refresh_from_db()
    if not request.htmx:
        if saved:
            messages.success(request, "tool policy saved")
            return redirect("run-detail", run_id=run.pk)
        messages.error(request, "; ".join(form.errors.get("rules", ["invalid policy"])))
        return redirect("run-detail", run_id=run.pk)
    context = {
        "run": run,
        "rights": access.Rights.of(request.user, run),
        "policy_form": form if not saved else PolicyForm(initial={"rules": _json(run.tool_policy)}),
        "policy_saved": saved,
    }
    return render(request, "runs/detail.html#policy", context)


# --- artifacts -------------------------------------------------------------------------------
def _artifact(user, run_id: int, artifact_id: int) -> tuple[Run, Artifact]:
    run = access.get_run_for_user(user, run_id)
    return run, get_object_or_404(Artifact, pk=artifact_id, run=run)


def _viewer_kind(artifact: Artifact) -> str:
    mime = artifact.mime_type or mimetypes.guess_type(artifact.name)[0] or ""
    if mime in INLINE_IMAGES:
        return "image"
    if mime == "text/markdown" or artifact.name.lower().endswith((".md", ".markdown")):
        return "markdown"
    if mime.startswith("text/") or mime in {"application/json", "application/x-python"}:
        return "text"
    return "binary"


@login_required
@require_GET
def artifact_view(request: HttpRequest, run_id: int, artifact_id: int) -> HttpResponse:
    run, artifact = _artifact(request.user, run_id, artifact_id)
    kind = _viewer_kind(artifact)
    context = {"run": run, "artifact": artifact, "kind": kind, "truncated": False}
    if kind in {"text", "markdown", "binary"}:
        try:
            data = BlobStore().read_head(artifact.blob_hash, TEXT_VIEW_LIMIT + 1)
        except (FileNotFoundError, ValueError):
            data = None
            context["missing"] = True
        if data is not None:
            context["truncated"] = len(data) > TEXT_VIEW_LIMIT
            data = data[:TEXT_VIEW_LIMIT]
            if kind == "binary" and b"\0" not in data[:8000]:
                kind = context["kind"] = "text"
            if kind == "text":
                context["html"] = stream.highlight(data.decode("utf-8", "replace"), artifact.name)
            elif kind == "markdown":
                context["html"] = stream.markdown_html(data.decode("utf-8", "replace"))
    return render(request, "runs/artifact.html", context)


@login_required
@require_GET
def artifact_download(request: HttpRequest, run_id: int, artifact_id: int) -> HttpResponse:
    _, artifact = _artifact(request.user, run_id, artifact_id)
    try:
        f = BlobStore().open(artifact.blob_hash)
    except (FileNotFoundError, ValueError):
        raise Http404("the artifact's content is missing from the blob store") from None
    inline = request.GET.get("inline") == "1" and artifact.mime_type in INLINE_IMAGES
    response = FileResponse(
        f,
        as_attachment=not inline,
        filename=artifact.name.rsplit("/", 1)[-1],
        content_type=artifact.mime_type if inline else "application/octet-stream",
    )
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    return response


# --- approvals -------------------------------------------------------------------------------
@login_required
@require_GET
def approvals_inbox(request: HttpRequest) -> HttpResponse:
    items = list(pending_approvals(request.user))
    return render(
        request,
        "approvals/inbox.html",
        {"approvals": items, "can_decide": access.can_decide(request.user)},
    )


@login_required
@require_POST
def approval_decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = get_object_or_404(
        access.visible_approvals(request.user).select_related("run"), pk=approval_id
    )
    decision = request.POST.get("decision")
    comment = request.POST.get("comment", "")
    error = ""
    status = 200
    try:
        if decision == "approve":
            approvals.decide(
                approval.pk,
                user=request.user,
                approve=True,
                comment=comment,
                allow_similar=request.POST.get("allow_similar") == "1",
            )
        elif decision == "edit":
            try:
                edited = stream.parse_edit(approval, request.POST.get("edited", ""))
            except ValueError as e:
                raise approvals.ApprovalError(str(e)) from None
            approvals.decide(
                approval.pk, user=request.user, approve=True, edited_input=edited, comment=comment
            )
        elif decision == "deny":
            approvals.decide(approval.pk, user=request.user, approve=False, comment=comment)
        else:
            raise approvals.ApprovalError("choose approve, edit or deny")
    except approvals.NotAllowed as e:
        error, status = str(e), 403
    except approvals.ApprovalError as e:
        error = str(e)
    approval.refresh_from_db()
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(request.POST.get("next") or reverse("approvals"))
    return render(
        request,
        "approvals/inbox.html#approval-card",
        {
            "approval": approval,
            "can_decide": access.can_decide(request.user),
            "error": error,
            "show_run": request.POST.get("show_run") == "1",
        },
        status=status,
    )


# --- logging in ------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
def login_link(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    """The one-time link `make run` prints. GET asks for a click (link previews must not use
    it up); POST logs in, after which the token no longer matches (last_login changed)."""
    User = get_user_model()
    try:
        user = User.objects.get(pk=force_str(urlsafe_base64_decode(uidb64)))
    except (User.DoesNotExist, ValueError, TypeError, OverflowError):
        user = None
    if user is None or not default_token_generator.check_token(user, token):
        return render(request, "login_link.html", {"invalid": True}, status=403)
    if request.method == "GET":
        return render(request, "login_link.html", {"username": user.get_username()})
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect("home")
