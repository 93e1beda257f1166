from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.tokens import default_token_generator
from django.urls import reverse
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from agents.management.base import BaseCommand, fail


def login_link(user, base_url: str | None = None) -> str:
    """A link that logs `user` in once (it stops working when they log in: last_login moves)."""
    uid = urlsafe_base64_encode(force_bytes(user.pk))
    token = default_token_generator.make_token(user)
    return (base_url or settings.SHIFTLOG_BASE_URL) + reverse("login-link", args=[uid, token])


class Command(BaseCommand):
    help = (
        "Print a one-time login link for a user (the server's address from SHIFTLOG_BASE_URL, "
        "or --base-url). The link is the last line of output."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", default="admin", help="who logs in (default: admin)")
        parser.add_argument(
            "--base-url", help="the address the server is reached at, e.g. http://127.0.0.1:8765"
        )

    def handle(self, *args, **o):
        try:
            user = get_user_model().objects.get(username=o["user"], is_active=True)
        except get_user_model().DoesNotExist:
            raise fail(f"no active user named {o['user']!r}") from None
        base = (o["base_url"] or "").rstrip("/") or None
        if base is not None and not base.startswith(("http://", "https://")):
            raise fail("--base-url must start with http:// or https://")
        self.stdout.write(f"One-time login link for {user.get_username()}:")
        self.stdout.write(login_link(user, base))
