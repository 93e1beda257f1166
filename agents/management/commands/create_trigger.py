from __future__ import annotations

import secrets

from django.conf import settings
from django.urls import reverse

from agents.management.base import acting, fail, get_run, id_arg
from agents.management.schedule_base import ScheduleCommand
from agents.schedules import triggers


class Command(ScheduleCommand):
    help = (
        "Make an inbound webhook URL that creates a run from a run (POST JSON to it; the goal "
        "may name {payload.path} places). The URL, with its token, is shown once: the last line."
    )

    def add_arguments(self, parser):
        parser.add_argument("--from-run", type=id_arg, required=True, metavar="ID")
        parser.add_argument(
            "--secret",
            action="store_true",
            help="also require an HMAC-SHA256 signature of the body with a new secret (printed)",
        )
        parser.add_argument("--goal", default="", help="the runs' goal (default: the run's)")
        parser.add_argument("--base-url", help="the server's address (SHIFTLOG_BASE_URL)")
        parser.add_argument("--user", help="act as this user (the runs are theirs)")

    def handle(self, *args, **o):
        template = get_run(o["from_run"])
        user, _ = acting(o["user"])
        if user is not None and not (
            template.created_by_id == user.pk or user.has_perm("agents.control_run")
        ):
            raise fail(f"{user.get_username()} may not control run {template.pk}")
        base = (o["base_url"] or settings.SHIFTLOG_BASE_URL).rstrip("/")
        if not base.startswith(("http://", "https://")):
            raise fail("--base-url must start with http:// or https://")
        secret = secrets.token_urlsafe(32) if o["secret"] else ""
        trigger, token = triggers.create(
            template, secret=secret, goal=o["goal"], created_by=user or template.created_by
        )
        self.stdout.write(f"trigger {trigger.pk} (the token is shown only now)")
        if secret:
            self.stdout.write(f"secret: {secret}")
            self.stdout.write("sign: X-Shiftlog-Signature: sha256=HMAC_SHA256(secret, body)")
        self.stdout.write(base + reverse("hook", args=[token]))
