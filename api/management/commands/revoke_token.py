"""manage.py revoke_token ID_OR_PREFIX"""

from __future__ import annotations

from agents.management.base import BaseCommand, fail
from api.models import ApiToken


class Command(BaseCommand):
    help = "Revoke an API token, named by its id or the prefix create_token printed."

    def add_arguments(self, parser):
        parser.add_argument("token", metavar="ID_OR_PREFIX")

    def handle(self, *args, **o):
        key = o["token"].strip().rstrip("…")
        if key.isascii() and key.isdigit() and len(key) < 19:
            found = list(ApiToken.objects.filter(pk=int(key)))
        elif len(key) >= 6:
            found = list(ApiToken.objects.filter(prefix__startswith=key[:12]))
        else:
            raise fail("give the token's id or at least 6 characters of its prefix")
        if not found:
            raise fail(f"no token {key!r}")
        if len(found) > 1:
            raise fail(f"{len(found)} tokens start with {key!r}: give the id")
        token = found[0]
        if not token.revoke():
            raise fail(f"token {token.prefix}… (id {token.pk}) was already revoked")
        self.stdout.write(f"revoked token {token.prefix}… (id {token.pk}) of {token.user}")
