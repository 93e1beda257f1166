"""Logging in: passwords and one-time links, throttled by django-axes (per account and per
address), the lockout said plainly, seen in the admin and lifted by a command."""

from __future__ import annotations

from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from tests.helpers import client_for


def log_in(password: str, username: str = "olivia", ip: str = "10.0.0.1"):
    return Client(REMOTE_ADDR=ip).post(
        "/accounts/login/", {"username": username, "password": password}
    )


def logged_in(response) -> bool:
    return response.status_code == 302 and response.url == "/overview/"


def test_the_right_password_logs_in(owner):
    assert logged_in(log_in("pw-olivia-1"))


def test_after_five_wrong_passwords_the_account_is_locked_even_with_the_right_one(owner):
    for _ in range(4):
        response = log_in("wrong")
        assert response.status_code == 200 and b'class="error"' in response.content
    assert log_in("wrong").status_code == 429  # the fifth: locked out from here on
    locked = log_in("pw-olivia-1")
    assert not logged_in(locked) and locked.status_code == 429
    assert b"Too many failed logins" in locked.content and b"unlock_login" in locked.content
    # From another address too: the account is locked, not only the address.
    assert log_in("pw-olivia-1", ip="10.9.9.9").status_code == 429


def test_an_address_that_tries_many_accounts_is_locked_but_not_the_accounts(owner):
    for i in range(5):
        log_in("wrong", username=f"guess{i}", ip="10.0.0.66")
    assert log_in("pw-olivia-1", ip="10.0.0.66").status_code == 429
    assert logged_in(log_in("pw-olivia-1", ip="10.0.0.7"))  # olivia elsewhere is fine


def test_unlock_login_lifts_a_lockout_and_says_how_much(owner):
    for _ in range(5):
        log_in("wrong")
    assert log_in("pw-olivia-1").status_code == 429
    out = StringIO()
    call_command("unlock_login", "--user", "olivia", stdout=out)
    assert "lifted" in out.getvalue()
    assert logged_in(log_in("pw-olivia-1"))


def test_admins_see_the_failed_attempts(owner):
    log_in("wrong")
    admin = get_user_model().objects.create_superuser("root", password="pw-root-12345")
    page = client_for(admin).get("/admin/axes/accessattempt/")
    assert page.status_code == 200 and b"olivia" in page.content
    assert AccessAttempt.objects.filter(username="olivia").exists()


def test_guessing_one_time_links_is_throttled_like_passwords(owner):
    from agents.management.commands.login_link import login_link

    c = Client(REMOTE_ADDR="10.0.0.5")
    for i in range(4):
        assert c.get(f"/login/MQ/guess-{i}/").status_code == 403
    assert c.get("/login/MQ/guess-4/").status_code == 429
    good = login_link(owner).split("127.0.0.1:8000", 1)[1]
    assert c.get(good).status_code == 429  # even a good link, from the guessing address
    other = Client(REMOTE_ADDR="10.0.0.6")
    assert other.get(good).status_code == 200  # a positive control: elsewhere it works
    assert other.post(good).status_code == 302


def test_login_link_prints_a_link_for_the_port_served_as_its_last_line(owner):
    out = StringIO()
    call_command(
        "login_link", "--user", "olivia", "--base-url", "http://127.0.0.1:8765", stdout=out
    )
    link = out.getvalue().strip().splitlines()[-1]
    assert link.startswith("http://127.0.0.1:8765/login/")
    path = link.split("8765", 1)[1]
    c = Client()
    assert c.post(path).status_code == 302 and c.get("/").status_code == 200
    assert Client().post(path).status_code == 403  # used once, then no more


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--user", "nobody"], "no active user"),
        (["--user", "olivia", "--base-url", "ftp://x"], "--base-url must start"),
    ],
)
def test_login_link_refuses_bad_arguments(owner, args, said):
    from django.core.management import CommandError

    with pytest.raises(CommandError, match=said):
        call_command("login_link", *args, stdout=StringIO())


PROXY = "10.0.0.1"  # the TLS proxy: every request reaches Django from its address


def via_proxy(password: str, client: str, username: str = "olivia", *, forged: str = ""):
    """A login through the proxy, which appends the address it saw to X-Forwarded-For (after
    whatever the client wrote there itself)."""
    chain = f"{forged}, {client}" if forged else client
    return Client(REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=chain).post(
        "/accounts/login/", {"username": username, "password": password}
    )


def test_behind_a_trusted_proxy_five_bad_logins_lock_out_that_client_not_everyone(owner, settings):
    settings.SHIFTLOG_TRUSTED_PROXIES = 1
    for i in range(5):
        via_proxy("wrong", "198.51.100.7", username=f"guess{i}")
    assert via_proxy("pw-olivia-1", "198.51.100.7").status_code == 429
    # Another client behind the same proxy logs in.
    assert logged_in(via_proxy("pw-olivia-1", "198.51.100.8"))
    # The locked client writing another address to the left of the proxy's gets nowhere.
    assert via_proxy("pw-olivia-1", "198.51.100.7", forged="198.51.100.99").status_code == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"198.51.100.7"}


def test_behind_two_proxies_the_address_the_outer_one_saw_counts(owner, settings):
    settings.SHIFTLOG_TRUSTED_PROXIES = 2
    for i in range(5):  # the outer proxy appended the client, the inner one the outer's address
        via_proxy("wrong", "198.51.100.7, 10.0.0.2", username=f"guess{i}", forged=f"1.1.1.{i}")
    assert via_proxy("pw-olivia-1", "198.51.100.7, 10.0.0.2").status_code == 429
    assert logged_in(via_proxy("pw-olivia-1", "198.51.100.8, 10.0.0.2"))


def test_without_trusted_proxies_x_forwarded_for_is_ignored_and_cannot_dodge_a_lockout(owner):
    for i in range(5):  # a different forged address each time: all from one connection
        via_proxy("wrong", f"203.0.113.{i}", username=f"guess{i}")
    assert via_proxy("pw-olivia-1", "203.0.113.200").status_code == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {PROXY}


@pytest.mark.parametrize("header", ["", "not-an-address", "1.2.3.4, ,", "999.1.1.1"])
def test_a_broken_forwarded_chain_falls_back_to_the_connections_address(owner, settings, header):
    from django.test import RequestFactory

    from dashboard.client_ip import client_ip

    settings.SHIFTLOG_TRUSTED_PROXIES = 2
    request = RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR=header)
    assert client_ip(request) == PROXY
    ok = RequestFactory().get("/", REMOTE_ADDR=PROXY, HTTP_X_FORWARDED_FOR="[2001:db8::1]:443, x")
    assert client_ip(ok) == "2001:db8::1"
