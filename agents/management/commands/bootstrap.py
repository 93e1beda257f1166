from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model

from agents.management.base import BaseCommand
from agents.management.commands.login_link import login_link
from agents.models import Run
from agents.services import create_demo_run


class Command(BaseCommand):
    help = "First-run set-up: an admin account (no password) with a one-time login link, and the demo run."

    def add_arguments(self, parser):
        parser.add_argument("--no-demo", action="store_true")
        parser.add_argument(
            "--base-url", help="the address the server is reached at (default: SHIFTLOG_BASE_URL)"
        )

    def handle(self, *args, **o):
        User = get_user_model()
        admin = User.objects.filter(is_superuser=True).order_by("pk").first()
        if admin is None:
            admin = User.objects.create_user("admin", is_staff=True, is_superuser=True)
            admin.set_unusable_password()
            admin.save()
            self.stdout.write(
                "Created the admin account 'admin' (no password; use the link below)."
            )
        self.stdout.write(
            f"One-time login link for {admin.get_username()}: {login_link(admin, o['base_url'])}"
        )
        if not o["no_demo"] and not Run.objects.exists():
            run = create_demo_run(created_by=admin)
            manage = settings.MANAGE_COMMAND
            self.stdout.write(
                f"Created the demo run {run.pk} (scripted, offline). Watch it with:\n"
                f"  {manage} tail_run {run.pk} --follow\n"
                "Its risky step waits for your approval:\n"
                f"  {manage} approvals\n"
                f"  {manage} approve ID --user {admin.get_username()}"
            )
