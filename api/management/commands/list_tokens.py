"""manage.py list_tokens [--user NAME]"""

from __future__ import annotations

from agents.management.base import BaseCommand
from api.models import ApiToken


class Command(BaseCommand):
    help = "List API tokens (never the tokens themselves: only their prefixes)."

    def add_arguments(self, parser):
        parser.add_argument("--user", help="only this user's")

    def handle(self, *args, **o):
        rows = ApiToken.objects.select_related("user")
        if o["user"]:
            rows = rows.filter(user__username=o["user"])
        for t in rows:
            used = f"{t.last_used_at:%Y-%m-%d %H:%M}" if t.last_used_at else "never"
            self.stdout.write(
                f"{t.pk:>5}  {t.prefix}…  {t.user.get_username():<16} {','.join(t.scopes):<18} "
                f"{t.state:<8} used {used}  {t.name}"
                + (f" (run {t.run_id} only)" if t.run_id else "")
            )
