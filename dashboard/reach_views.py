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
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from agents import approvals, mail, reach, slack_interactions
from dashboard import views


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
    """GET shows the approval and asks for a decision; POST decides and uses the link up."""
    try:
        link = mail.open_link(token, request.user)
    except mail.LinkError as e:
        return render(request, "approvals/mail_link.html", {"refused": str(e)}, status=e.status)
    approval = link.approval
    may = reach.may_decide_on(request.user, approval.run)
    context = {"approval": approval, "may_decide": may, "token": token, "error": ""}
    if request.method == "POST" and may:
        fields = views.decision_fields(request.POST)
        if fields["decision"] not in ("approve", "deny"):
            context["error"] = "Choose Approve or Deny."
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
                mail.give_back(link)  # when nothing was decided, the link stays good
        approval.refresh_from_db()
    status = 200 if not context["error"] else 409
    if not may:
        status = 403
    return render(request, "approvals/mail_link.html", context, status=status)
