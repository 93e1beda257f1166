"""manage.py create_token --user NAME --scopes read,write,decide [--expires DAYS] [--name TEXT]

Prints the token once, as the last line of its output; only its hash is kept."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from agents.management.base import BaseCommand, fail
from api.models import SCOPES, ApiToken


def scopes_arg(text: str) -> list[str]:
    scopes = [s.strip() for s in text.split(",") if s.strip()]
    wrong = [s for s in scopes if s not in SCOPES]
    if not scopes or wrong:
        raise fail(
            f"--scopes: {', '.join(wrong) or 'none given'}; choose from {', '.join(SCOPES)} "
            "(comma-separated)"
        )
    return list(dict.fromkeys(scopes))


class Command(BaseCommand):
    help = "Make an API token for a user; it is shown once (only a hash is kept)."

    def add_arguments(self, parser):
        parser.add_argument("--user", required=True, help="the user the token acts as")
        parser.add_argument(
            "--scopes", required=True, help=f"comma-separated, of: {', '.join(SCOPES)}"
        )
        parser.add_argument("--expires", type=int, metavar="DAYS", help="valid for DAYS days")
        parser.add_argument("--name", default="", help="what the token is for")

    def handle(self, *args, **o):
        try:
            user = get_user_model().objects.get(username=o["user"])
        except get_user_model().DoesNotExist:
            raise fail(f"no user named {o['user']!r}") from None
        if not user.is_active:
            raise fail(f"user {o['user']!r} is not active")
        scopes = scopes_arg(o["scopes"])
        expires = None
        if o["expires"] is not None:
            if not 1 <= o["expires"] <= 3650:
                raise fail("--expires: DAYS must be from 1 to 3650")
            expires = timezone.now() + timedelta(days=o["expires"])
        if len(o["name"]) > 100:
            raise fail("--name: at most 100 characters")
        if "decide" in scopes and not user.has_perm("agents.decide_approval"):
            self.stderr.write(
                f"note: {user.get_username()} lacks the agents.decide_approval permission: "
                "the decide scope will be refused until they have it"
            )
        row, token = ApiToken.issue(user, scopes, name=o["name"], expires_at=expires)
        until = f", expires {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
        self.stdout.write(
            f"token {row.prefix}… (id {row.pk}) for {user.get_username()}, scopes "
            f"{','.join(scopes)}{until}. It is shown once; keep it secret:"
        )
        self.stdout.write(token)
