"""The dashboard's pages. Views stay thin: access in agents.access, actions in agents.services
and agents.approvals, the run page's panels in dashboard.panels and approval cards in
dashboard.cards (the WebSocket pushes the same fragments)."""

from __future__ import annotations

import json
import mimetypes
from urllib.parse import urlencode

from axes.handlers.proxy import AxesProxyHandler
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.signals import user_login_failed
from django.contrib.auth.tokens import default_token_generator
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents import access, approvals, blobstore, inputs, overview, pages, reach, services, streaming
from agents.models import (
    Artifact,
    Event,
    Provider,
    Run,
    RunScript,
    RunStatus,
)
from agents.providers.scripted import builtin_script
from dashboard import cards, inbox, markup, panels, stream
from dashboard.fleets import tree as fleet
from dashboard.fleets import views as fleet_views
from dashboard.forms import NewRunForm, PolicyForm, RuleFormSet, RunFilterForm
from dashboard.redirects import safe_next

TEXT_VIEW_LIMIT = 1_000_000
# A live runs list re-reads its page this often, in case a pushed row was dropped.
LIST_POLL_SECONDS = 10
INLINE_IMAGES = {"image/png", "image/jpeg", "image/gif", "image/webp"}  # never SVG: it runs script


# --- pages -----------------------------------------------------------------------------------
@login_required
@require_GET
def runs(request: HttpRequest) -> HttpResponse:
    form = RunFilterForm(request.GET)
    filters = form.active()
    qs = filter_runs(access.visible_runs(request.user), filters)
    q = request.GET.get("q", "").replace("\x00", "").strip()[:200]
    if q:
        qs = qs.filter(goal__icontains=q)
    grouped = request.GET.get("group") == "fleet"
    if grouped:  # roots only; each root's fleet below it (one more query for the page)
        qs = qs.filter(parent__isnull=True)
    page_error = ""
    try:
        page = pages.runs_page(qs, **_runs_cursor(request.GET))
    except inputs.InputError as e:
        # A link from an older page, a typo: the newest runs, and a word about it.
        page_error = f"{e} Showing the newest runs."
        page = pages.runs_page(qs)
    query = urlencode(
        {**filters, **({"q": q} if q else {}), **({"group": "fleet"} if grouped else {})}
    )
    if grouped:
        below = fleet.list_children(request.user, list(page.rows))
        for root in page.rows:  # the same rows (evaluated once, above)
            root.fleet_nodes = below[root.pk]
    context = {
        "grouped": grouped,
        "page": page,
        "page_error": page_error,
        "form": form,
        "status": filters.get("status", ""),
        "q": q,
        "statuses": RunStatus.choices,
        "filter_query": urlencode(filters),
        "list_query": query,
        # Rows pushed live follow the status and search filters only: a list filtered by the
        # Overview's figures is as it was loaded (the header's count stays live).
        "rows_live": not (filters.keys() - {"status"}),
        "list_poll": LIST_POLL_SECONDS,
    }
    template = "runs/list.html#run-table" if request.htmx else "runs/list.html"
    return render(request, template, context, status=400 if form.errors or page_error else 200)


def _runs_cursor(params) -> dict:
    """The runs list's place: ?after=CURSOR (older), ?before=CURSOR (newer), ?oldest=1."""
    if params.get("after"):
        return {"after": pages.Cursor.parse(params["after"], what="after")}
    if params.get("before"):
        return {"before": pages.Cursor.parse(params["before"], what="before")}
    return {"oldest": params.get("oldest") == "1"}


def filter_runs(qs: QuerySet[Run], filters: dict[str, str]) -> QuerySet[Run]:
    """The runs list's filters; each is a figure of the Overview (agents.overview)."""
    if filters.get("status"):
        qs = qs.filter(status=filters["status"])
    if filters.get("provider"):
        qs = qs.filter(provider=filters["provider"])
    if filters.get("stuck"):
        qs = overview.stuck(qs, timezone.now())
    if filters.get("stalled"):
        qs = overview.stalled(qs, timezone.now())
    if filters.get("approvals"):
        qs = overview.waiting_for_approval(qs)
    if filters.get("fleet"):
        qs = qs.filter(Q(parent__isnull=False) | Exists(Run.objects.filter(parent=OuterRef("pk"))))
    if filters.get("since"):
        qs = overview.spent_since(qs, overview.window_start(filters["since"], timezone.now()))
    return qs


@login_required
@require_http_methods(["GET", "POST"])
def new_run(request: HttpRequest) -> HttpResponse:
    if request.method == "GET":
        return render(request, "runs/new.html", _new_run_context(request))
    form = NewRunForm(request.POST, request.FILES)
    # A post without the rows (a script, an older page) has no rows: not an error.
    rows = request.POST if "rules-TOTAL_FORMS" in request.POST else None
    rules = RuleFormSet(rows, prefix="rules")
    if form.is_valid() and (not rules.is_bound or rules.is_valid()):
        data = form.cleaned_data
        script, script_name = data["script"], ""
        if data["provider"] == Provider.SCRIPTED:
            if script is not None:
                script_name = request.FILES["script"].name[:200]
            elif data["script_from"]:
                script, script_name = _script_of(request.user, data["script_from"])
            if script is None:
                script, script_name = _demo_script(), "demo (built in)"
        rows = [f.rule() for f in rules.forms] if rules.is_bound else []
        policy = [r for r in rows if r] + data["tool_policy"]
        try:
            run = services.create_run(
                form.spec(script=script, script_name=script_name, tool_policy=policy),
                created_by=request.user,
            )
        except services.RunError as e:
            field = {"acceptance": "criteria", "protected_paths": "protect"}.get(e.field, e.field)
            form.add_error(field if field in form.fields else None, str(e))
        else:
            return redirect("run-detail", run_id=run.pk)
    context = {"form": form, "rules": rules, "again": form.data.get("script_from")}
    return render(request, "runs/new.html", context, status=400)


def _new_run_context(request: HttpRequest) -> dict:
    """The empty form, the demo's, or a run's own ("Run again with changes", ?from=ID)."""
    if request.GET.get("from"):
        try:
            source = access.get_run_for_user(
                request.user, inputs.object_id(request.GET["from"], what="from")
            )
        except inputs.InputError:
            raise Http404("no such run") from None
        initial, rows, rest = NewRunForm.initial_from(source)
        initial["tool_policy"] = rest
        return {
            "form": NewRunForm(initial=initial),
            "rules": RuleFormSet(initial=rows, prefix="rules"),
            "again": source,
        }
    form = NewRunForm.demo() if request.GET.get("demo") else NewRunForm()
    return {"form": form, "rules": RuleFormSet(prefix="rules")}


def _script_of(user, run_id: int) -> tuple[dict | None, str]:
    """The script of a run the user may see (to run it again), or None."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None or not access.can_see(user, run):
        return None, ""
    script = RunScript.objects.filter(run=run).values_list("script", flat=True).first()
    return script, run.script_name if script is not None else ""


def _demo_script() -> dict:
    script = builtin_script("demo")
    script["turn_delay_seconds"] = settings.SHIFTLOG["DEMO_TURN_DELAY_SECONDS"]
    return script


@login_required
@require_GET
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = access.get_run_for_user(request.user, run_id)
    # ?all=1 (an older page's "show all") is the newest page now: older items come in pages.
    context = panels.context(run, access.Rights.of(request.user, run))
    rows = stream.mark_abandoned(stream.newest(run.pk), context["abandoned_ranges"])
    context.update(
        {
            "rows": rows,
            "oldest_seq": rows[0].seq if rows else None,
            "has_older": bool(rows) and rows[0].seq > 1,
            "last_seq": rows[-1].seq if rows else 0,
            "policy_form": PolicyForm(initial={"rules": _json(run.tool_policy)}),
            # An external run waiting for (or driven by) its agent: how to connect one.
            "connect": {
                "url": request.build_absolute_uri("/").rstrip("/"),
                "user": request.user.get_username(),
            }
            if run.is_external and run.is_live
            else None,
            **fleet_views.context(request.user, run, context.get("rollup")),
            "approvals_go": reach.where_approvals_go(run),
        }
    )
    return render(request, "runs/detail.html", context)


@login_required
@require_GET
def run_state(request: HttpRequest, run_id: int) -> HttpResponse:
    """The header's status, provider and last contact, which a live external run's page re-reads
    on a timer: that its agent went silent (stalled) is measured, never pushed."""
    run = access.get_run_for_user(request.user, run_id)
    return render(request, f"runs/detail.html#{panels.STATE}", {"run": run})


def _json(value) -> str:
    return json.dumps(value, indent=2)


@login_required
@require_GET
def run_events(request: HttpRequest, run_id: int) -> HttpResponse:
    """Older events, for scrolling back: a page of rows and the next "older" marker."""
    run = access.get_run_for_user(request.user, run_id)
    try:
        before = inputs.whole_number(
            request.GET.get("before", ""), what="before", maximum=inputs.MAX_BIG_INT
        )
    except inputs.InputError:
        raise Http404("before=SEQ is required") from None
    rows = stream.mark_abandoned(
        stream.newest(run.pk, before=before), Event.objects.abandoned_ranges(run.pk)
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
    context = panels.context(run, access.Rights.of(request.user, run), panels=("run-header",))
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
    """Budgets a person raised on resuming (checked by the service, as the CLI's are)."""
    fields = ("max_sessions", "max_tokens", "max_cost_usd", "max_wall_seconds")
    values = {f: request.POST.get(f, "").strip() or None for f in fields}
    return services.Budgets(**values) if any(values.values()) else None


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
            services.set_policy(
                run.pk,
                form.cleaned_data["rules"],
                actor=services.actor_for(request.user),
                because="changed in the dashboard",
            )
            saved = True
        except services.RunError as e:
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
            data = blobstore.configured().read_head(artifact.blob_hash, TEXT_VIEW_LIMIT + 1)
        except (FileNotFoundError, ValueError):
            data = None
            context["missing"] = True
        if data is not None:
            context["truncated"] = len(data) > TEXT_VIEW_LIMIT
            data = data[:TEXT_VIEW_LIMIT]
            if kind == "binary" and b"\0" not in data[:8000]:
                kind = context["kind"] = "text"
            if kind == "text":
                context["html"] = markup.highlight(data.decode("utf-8", "replace"), artifact.name)
            elif kind == "markdown":
                context["html"] = markup.markdown_html(data.decode("utf-8", "replace"))
    return render(request, "runs/artifact.html", context)


@login_required
@require_GET
def artifact_download(request: HttpRequest, run_id: int, artifact_id: int) -> HttpResponse:
    _, artifact = _artifact(request.user, run_id, artifact_id)
    try:
        f = blobstore.configured().open(artifact.blob_hash)
    except (FileNotFoundError, ValueError):
        raise Http404("the artifact's content is missing from the blob store") from None
    inline = request.GET.get("inline") == "1" and artifact.mime_type in INLINE_IMAGES
    return streaming.file_response(
        request,
        f,
        as_attachment=not inline,
        filename=artifact.name.rsplit("/", 1)[-1],
        content_type=artifact.mime_type if inline else "application/octet-stream",
    )


# --- approvals -------------------------------------------------------------------------------
@login_required
@require_GET
def approvals_inbox(request: HttpRequest) -> HttpResponse:
    """Paged, one section per run (dashboard/inbox.py)."""
    return render(
        request,
        "approvals/inbox.html",
        {**inbox.context(request.user, request.GET), "can_decide": access.can_decide(request.user)},
    )


def decision_fields(post) -> dict:
    """A decision in the one vocabulary (agents/approvals.py: decision, reason, input,
    allow_similar); the names of pages from before (comment, edited, approve-for-run) too."""
    decision = post.get("decision") or ""
    similar = post.get("allow_similar") in ("1", "true", "on")
    if decision == "approve-for-run":
        decision, similar = "approve", True
    return {
        "decision": decision,
        "reason": post.get("reason", post.get("comment", "")),
        "input": post.get("input", post.get("edited")) if decision == "edit" else None,
        "allow_similar": similar,
    }


@login_required
@require_POST
def approval_decide(request: HttpRequest, approval_id: int) -> HttpResponse:
    approval = access.get_approval_for_user(request.user, approval_id)
    error = ""
    status = 200
    try:
        approvals.decide_as(approval_id, user=request.user, **decision_fields(request.POST))
    except approvals.NotAllowed as e:
        error, status = str(e), 403
    except approvals.ApprovalError as e:
        error = str(e)
    approval.refresh_from_db()
    if not request.htmx:
        if error:
            messages.error(request, error)
        return redirect(safe_next(request, request.POST.get("next"), reverse("approvals")))
    card = cards.render(
        approval,
        can_decide=access.can_decide(request.user),
        show_run=request.POST.get("show_run") == "1",
        error=error,
        request=request,
        user=request.user,
    )
    return HttpResponse(card, status=status)


# --- logging in ------------------------------------------------------------------------------
@require_http_methods(["GET", "POST"])
def login_link(request: HttpRequest, uidb64: str, token: str) -> HttpResponse:
    """The one-time link `make run` and `manage.py login_link` print. GET asks for a click (link
    previews must not use it up); POST logs in, after which the token no longer matches
    (last_login changed). A wrong token counts as a failed login (django-axes), so the links
    cannot be guessed at any faster than passwords."""
    User = get_user_model()
    if AxesProxyHandler.is_locked(request):
        return render(request, "registration/locked_out.html", status=429)
    try:
        user = User.objects.get(pk=force_str(urlsafe_base64_decode(uidb64)))
    except (User.DoesNotExist, ValueError, TypeError, OverflowError):
        user = None
    if user is None or not default_token_generator.check_token(user, token):
        user_login_failed.send(
            sender=__name__, credentials={"username": "(one-time link)"}, request=request
        )
        return render(request, "login_link.html", {"invalid": True}, status=403)
    if request.method == "GET":
        return render(request, "login_link.html", {"username": user.get_username()})
    login(request, user, backend="django.contrib.auth.backends.ModelBackend")
    return redirect(settings.LOGIN_REDIRECT_URL)
