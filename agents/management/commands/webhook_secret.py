from __future__ import annotations

from django.conf import settings

from agents.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Print the secret webhooks are signed with (Standard Webhooks), for receivers to verify "
        "them. It is the last line of output."
    )

    def handle(self, *args, **o):
        self.stdout.write("Webhooks carry webhook-id, webhook-timestamp and webhook-signature")
        self.stdout.write("headers (https://www.standardwebhooks.com); verify them with:")
        self.stdout.write(settings.SHIFTLOG["WEBHOOK_SECRET"])
