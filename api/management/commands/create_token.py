"""manage.py create_token --user NAME --scopes read,write,decide [--expires DAYS] [--name TEXT]
manage.py create_token --run ID [--user NAME] [--expires DAYS]: a token for that run's agent
(read and write on that run only, never decide), acting as NAME (default: whoever made the run).

Prints the token once, as the last line of its output; only its hash is kept."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from agents import access
from agents.management.base import BaseCommand, fail
from agents.models import Run
from api.models import SCOPES, ApiToken, connect_command


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
        parser.add_argument(
            "--user", help="the user the token acts as (with --run: who made the run by default)"
        )
        parser.add_argument(
            "--scopes",
            help=f"comma-separated, of: {', '.join(SCOPES)} (with --run: read,write, never decide)",
        )
        parser.add_argument(
            "--run",
            type=int,
            metavar="ID",
            help="a token for this run's agent: it acts for that run only and never decides",
        )
        parser.add_argument("--expires", type=int, metavar="DAYS", help="valid for DAYS days")
        parser.add_argument("--name", default="", help="what the token is for")

    def handle(self, *args, **o):
        run = _run(o["run"]) if o["run"] is not None else None
        if o["user"] is None and (run is None or run.created_by is None):
            raise fail("--user: required (unless --run names a run that has a creator)")
        try:
            user = get_user_model().objects.get(username=o["user"]) if o["user"] else run.created_by
        except get_user_model().DoesNotExist:
            raise fail(f"no user named {o['user']!r}") from None
        if not user.is_active:
            raise fail(f"user {user.get_username()!r} is not active")
        if run is None and o["scopes"] is None:
            raise fail("--scopes: required (comma-separated, of: " + ", ".join(SCOPES) + ")")
        scopes = scopes_arg("read,write" if o["scopes"] is None else o["scopes"])
        if run is not None:
            if "decide" in scopes:
                raise fail("--scopes: a token made for one run can never decide")
            if not access.can_control(user, run):
                raise fail(f"{user.get_username()} may not drive run {run.pk}")
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
        name = o["name"] or (f"agent of run {run.pk}" if run else "")
        row, token = ApiToken.issue(user, scopes, name=name, expires_at=expires, run=run)
        until = f", expires {expires:%Y-%m-%d %H:%M} UTC" if expires else ""
        only = f", for run {run.pk} only" if run else ""
        self.stdout.write(
            f"token {row.prefix}… (id {row.pk}) for {user.get_username()}, scopes "
            f"{','.join(scopes)}{only}{until}. It is shown once; keep it secret:"
        )
        if run is not None:
            base = settings.SHIFTLOG_BASE_URL.rstrip("/")
            self.stdout.write(f"In the repository: {connect_command(base, token, run.pk)}")
        self.stdout.write(token)


def _run(run_id: int) -> Run:
    found = Run.objects.select_related("created_by").filter(pk=run_id).first()
    if found is None:
        raise fail(f"--run: no run with id {run_id}")
    return found
