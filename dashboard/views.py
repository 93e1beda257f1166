from __future__ import annotations

from django.contrib.auth import get_user_model, login
from django.contrib.auth.decorators import login_required
from django.contrib.auth.tokens import default_token_generator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.encoding import force_str
from django.utils.http import urlsafe_base64_decode
from django.views.decorators.http import require_http_methods


@login_required
def home(request: HttpRequest) -> HttpResponse:
    # The dashboard's own pages come with their issue; until then runs live in the admin.
    return redirect("admin:agents_run_changelist")


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
