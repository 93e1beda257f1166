"""Where people decide away from the dashboard: Slack's interactivity endpoint, and the page a
mailed one-time link opens (agents/slack.py, agents/mail.py).

Slack's endpoint has no session: a request counts only with a valid signature of Slack's signing
secret, made within the last five minutes (slack_sdk's SignatureVerifier); then the click is
the Slack user's, mapped to a Shiftlog user (agents/slack_interactions.py). The mail link's page
needs a login like every page, as the person it was mailed to, and a confirming POST.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from agents import (
    access,
    approvals,
    inputs,
    mail,
    reach,
    services,
    slack_interactions,
    slack_link,
)
from agents.models import Reach
from dashboard import cards, views


@csrf_exempt
@require_POST
def slack_interactive(request: HttpRequest) -> HttpResponse:
    secret = settings.SHIFTLOG["SLACK_SIGNING_SECRET"]
    if not secret:
        return HttpResponse("Slack is not set up here.", status=404, content_type="text/plain")
    from slack_sdk.signature import SignatureVerifier  # noqa: PLC0415 (the `slack` extra)

    body = request.body.decode("utf-8", errors="replace")
    timestamp = request.headers.get("X-Slack-Request-Timestamp", "")
    # A missing or non-numeric timestamp is no signature (the verifier would raise on it).
    if (
        not timestamp.isascii()
        or not timestamp.isdigit()
        or not SignatureVerifier(secret).is_valid(
            body=body,
            timestamp=timestamp,
            signature=request.headers.get("X-Slack-Signature", ""),
        )
    ):
        return HttpResponse(
            "refused: no valid Slack signature within the last five minutes",
            status=401,
            content_type="text/plain",
        )
    try:
        payload = json.loads(request.POST.get("payload", ""))
    except ValueError:
        payload = None
    if not isinstance(payload, dict):
        return HttpResponse(
            "refused: no interaction payload", status=400, content_type="text/plain"
        )
    answer = slack_interactions.handle(payload)
    if answer.body is not None:
        return JsonResponse(answer.body)
    return HttpResponse(status=200)


@login_required
@require_http_methods(["GET", "POST"])
def mail_link(request: HttpRequest, token: str) -> HttpResponse:
    """GET shows the approval and asks for a decision (approve, approve edited, deny); POST
    decides through `approvals.decide_as`, as the inbox does, and uses the link up."""
    try:
        link = mail.open_link(token, request.user)
    except mail.LinkError as e:
        return render(request, "approvals/mail_link.html", {"refused": str(e)}, status=e.status)
    approval = link.approval
    may = reach.may_decide_on(request.user, approval.run)
    cannot_edit = approvals.edit_refusal(approval)
    context = {
        "approval": approval,
        "may_decide": may,
        "token": token,
        "error": "",
        "cannot_edit": cannot_edit,
        "edit_value": cards.edit_value(approval),
    }
    if request.method == "POST" and may:
        fields = views.decision_fields(request.POST)
        if fields["decision"] not in approvals.DECISIONS:
            context["error"] = "Choose Approve, Approve edited or Deny."
        elif fields["decision"] == "edit" and cannot_edit:
            context["error"] = f"Nothing changed: {cannot_edit}."
        elif fields["decision"] == "edit" and not (fields["input"] or "").strip():
            context.update(error="Nothing changed: an edit needs the whole edited input (JSON).")
            context["edit_open"] = True
        elif not mail.use_link(link):
            return render(
                request,
                "approvals/mail_link.html",
                {"refused": "This link was already used; each link works once."},
                status=410,
            )
        else:
            try:
                approvals.decide_as(approval.pk, user=request.user, **fields)
                context["done"] = approvals.what_next(approval.run_id)
            except approvals.ApprovalError as e:
                context["error"] = str(e)
                if fields["decision"] == "edit":
                    # What they typed, shown again to fix.
                    context.update(edit_value=fields["input"], edit_open=True)
                mail.give_back(link)  # when nothing was decided, the link stays good
        approval.refresh_from_db()
    status = 200 if not context["error"] else 409
    if not may:
        status = 403
    return render(request, "approvals/mail_link.html", context, status=status)


@login_required
@require_POST
def run_slack(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's "Slack for this run": its own channel and news (empty: its project's);
    for who may control the run."""
    run = access.get_controllable_run(request.user, run_id)
    news = request.POST.get("slack_news", "").strip() or "project"
    try:
        reach.set_run_slack(
            run,
            channel=request.POST.get("slack_channel", ""),
            news=news,
            actor=services.actor_for(request.user),
        )
    except inputs.InputError as e:
        messages.error(request, f"Slack settings not saved: {e}")
    else:
        messages.success(request, f"run {run.pk}: Slack settings saved")
    return redirect("run-detail", run_id=run.pk)


# --- the person's own page: /me/reach/ ------------------------------------------------------
@login_required
@require_http_methods(["GET", "POST"])
def my_reach(request: HttpRequest) -> HttpResponse:
    """Your notifications: your Slack link (asked through Slack itself, agents/slack_link.py)
    and the mails you opted in to; POST saves the mail switches."""
    row = Reach.objects.filter(user=request.user).first()
    if request.method == "POST":
        row = row or Reach(user=request.user)
        row.mail_approvals = request.POST.get("mail_approvals") == "on"
        row.mail_run_endings = request.POST.get("mail_run_endings") == "on"
        row.save()
        messages.success(request, "Mail settings saved.")
        if (row.mail_approvals or row.mail_run_endings) and not request.user.email:
            messages.warning(request, "You have no email address here: ask an admin to set it.")
        return redirect("my-reach")
    context = {
        "row": row,
        "slack_id": row.slack_user_id if row else "",
        "slack_not_ready": slack_link.not_ready(),
        "link_minutes": settings.SHIFTLOG["SLACK_LINK_SECONDS"] // 60,
        "mail_on": settings.SHIFTLOG["MAIL_NOTIFICATIONS"],
        "nav": "me",
    }
    return render(request, "reach/mine.html", context)


@login_required
@require_POST
def my_slack_link(request: HttpRequest) -> HttpResponse:
    """Ask for a link: the bot sends the Slack user a button; nothing is linked until it is
    clicked by them."""
    given = request.POST.get("slack_user_id", "")
    try:
        slack_link.ask(request.user, given)
    except slack_link.LinkError as e:
        messages.error(request, f"Not linked: {e}")
    else:
        messages.success(
            request,
            f"Sent: Shiftlog's bot sent {given.strip()} a direct message in Slack. Click "
            f"“Link to {request.user.get_username()}” there to finish.",
        )
    return redirect("my-reach")


@login_required
@require_POST
def my_slack_unlink(request: HttpRequest) -> HttpResponse:
    was = slack_link.unlink(request.user)
    if was:
        messages.success(request, f"Unlinked Slack member {was}: clicks from it no longer act.")
    else:
        messages.info(request, "No Slack account was linked.")
    return redirect("my-reach")
