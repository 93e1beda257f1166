from __future__ import annotations

from axes.utils import reset

from agents.management.base import BaseCommand, fail


class Command(BaseCommand):
    help = "Lift a login lockout (django-axes): for an account, an address, or everyone."

    def add_arguments(self, parser):
        which = parser.add_mutually_exclusive_group(required=True)
        which.add_argument("--user", metavar="NAME", help="the account's username")
        which.add_argument("--ip", metavar="ADDRESS", help="the address logins came from")
        which.add_argument("--all", action="store_true", help="every lockout")

    def handle(self, *args, **o):
        if o["user"] is not None and not o["user"].strip():
            raise fail("--user needs a username")
        if o["all"]:
            count = reset()
        elif o["user"] is not None:
            count = reset(username=o["user"])
        else:
            count = reset(ip=o["ip"])
        self.stdout.write(f"lifted: {count} record(s) of failed logins removed")
