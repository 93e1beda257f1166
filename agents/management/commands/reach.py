from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from agents import inputs, reach
from agents.management.base import BaseCommand, acting, fail, get_run
from agents.models import ProjectReach, Reach


def _switch(value: str | None) -> bool | None:
    return None if value is None else value == "on"


class Command(BaseCommand):
    help = (
        "Where people and projects are reached (Slack and mail; the admin edits the same): "
        "`reach --user NAME --slack-id U… --mail-approvals on`, `reach --project NAME --channel "
        "C…`, or no option to list both."
    )

    def add_arguments(self, parser):
        parser.add_argument("--user", metavar="NAME", help="a person's settings")
        parser.add_argument("--slack-id", metavar="U…", help="their Slack member id ('' clears)")
        parser.add_argument("--mail-approvals", choices=("on", "off"))
        parser.add_argument("--mail-run-endings", choices=("on", "off"))
        parser.add_argument(
            "--project", metavar="NAME", help="a project's Slack channel ('' for the default)"
        )
        parser.add_argument(
            "--run",
            type=int,
            metavar="ID",
            help="a run's own Slack settings (with --channel, --news)",
        )
        parser.add_argument(
            "--channel",
            metavar="C…|#NAME",
            help="the project's (or the run's: '' for its project's) channel",
        )
        parser.add_argument(
            "--news",
            metavar="KINDS",
            help="with --run: which run news goes to Slack: any of ended,paused,budget; off; or "
            "project (its project's settings)",
        )

    def handle(self, *args, **o):
        if o["run"] is not None:
            self._run(o)
            return
        if o["news"] is not None:
            raise fail("--news is a run's setting: give --run ID")
        if o["user"] is not None:
            self._person(o)
        elif o["project"] is not None:
            if o["channel"] is None:
                raise fail("--project needs --channel")
            row, _ = ProjectReach.objects.update_or_create(
                project=o["project"].strip(), defaults={"slack_channel": o["channel"].strip()}
            )
            self.stdout.write(f"project {row}")
        for row in ProjectReach.objects.order_by("project"):
            self.stdout.write(f"project {row}")
        for row in Reach.objects.select_related("user").order_by("user__username"):
            mails = [
                n
                for n, on in (
                    ("approvals", row.mail_approvals),
                    ("run endings", row.mail_run_endings),
                )
                if on
            ]
            self.stdout.write(
                f"person {row.user.get_username()}: Slack {row.slack_user_id or '-'}, mail "
                f"{', '.join(mails) or 'none'}"
            )

    def _run(self, o) -> None:
        run = get_run(o["run"])
        try:
            run = reach.set_run_slack(
                run, channel=o["channel"], news=o["news"], actor=acting(None)[1]
            )
        except inputs.InputError as e:
            raise fail(str(e)) from None
        route = reach.where_approvals_go(run)
        own = "its own" if route["own"] else "its project's"
        news = ", ".join(route["news"]) or "none"
        channel = run.slack_channel or reach.route_for(run).slack_channel or "-"
        self.stdout.write(
            f"run {run.pk}: Slack channel {channel}, run news {news} ({own} settings)"
        )

    def _person(self, o) -> None:
        user = get_user_model().objects.filter(username=o["user"]).first()
        if user is None:
            raise fail(f"no user {o['user']!r}")
        row, _ = Reach.objects.get_or_create(user=user)
        if o["slack_id"] is not None:
            row.slack_user_id = o["slack_id"].strip()
        for name in ("mail_approvals", "mail_run_endings"):
            if _switch(o[name]) is not None:
                setattr(row, name, _switch(o[name]))
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            raise fail(f"Slack id {row.slack_user_id} is already someone else's") from None
        if (row.mail_approvals or row.mail_run_endings) and not user.email:
            self.stderr.write(f"note: {user.get_username()} has no email address: no mail")
