"""Where a run's webhooks may go (issue 31): anyone who may create runs sets their URLs, so a URL
that is, or resolves to, an address on this machine or a private network (Redis, a cloud's
metadata service) is refused when it is set, over the API and the web, and again at delivery,
after resolving: nothing is POSTed there, and the delivery fails with the reason.

Real HTTP throughout; only name resolution is played, in-process (`socket.getaddrinfo` answers
for made-up names), where an attacker's DNS server would answer.
"""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import Client

from agents import notifications, tasks
from agents.models import Event, Run, WebhookDelivery
from api.models import ApiToken
from tests.helpers import client_for, finish_turn, make_run

pytestmark = pytest.mark.django_db

LOOPBACK_NAME = "hooks-at-home.example"  # resolves to 127.0.0.1
REBINDING_NAME = "hooks-rebind.example"  # does not resolve until `rebound`, then to 127.0.0.1


class DNS:
    def __init__(self, monkeypatch) -> None:
        self.rebound = False
        real = socket.getaddrinfo

        def getaddrinfo(host, port, *args, **kwargs):
            if host == LOOPBACK_NAME or (host == REBINDING_NAME and self.rebound):
                return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port or 0))]
            if host == REBINDING_NAME:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return real(host, port, *args, **kwargs)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.fixture
def dns(monkeypatch) -> DNS:
    return DNS(monkeypatch)


class Receiver:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                receiver.bodies.append(
                    json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                )
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    started = Receiver()
    yield started
    started.close()


REFUSED = [
    "http://127.0.0.1:6379/",
    "http://169.254.169.254/latest/meta-data/",
    "http://10.1.2.3/hook",
    "http://192.168.0.10:8080/hook",
    "http://[::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://localhost:8000/hook",
    "http://2130706433/hook",  # 127.0.0.1 as one number
    "http://0.0.0.0/hook",
    f"https://{LOOPBACK_NAME}/hook",
]


@pytest.mark.parametrize("url", REFUSED)
def test_a_webhook_to_this_machine_or_a_private_network_is_refused_over_the_api(
    owner, dns, url
) -> None:
    _, token = ApiToken.issue(owner, ["read", "write"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {token}")
    response = client.post(
        "/api/v1/runs",
        json.dumps({"goal": "g", "checks": ["true"], "webhook_urls": [url]}),
        content_type="application/json",
    )
    assert response.status_code == 422, response.content[:500]
    detail = response.json()["detail"]
    assert "webhook" in detail and "public addresses only" in detail, detail
    assert not Run.objects.exists()


@pytest.mark.parametrize("url", REFUSED[:3] + REFUSED[-1:])
def test_a_webhook_to_this_machine_or_a_private_network_is_refused_in_the_form(
    owner, dns, url
) -> None:
    response = client_for(owner).post(
        "/runs/new/",
        {"goal": "g", "checks": "true", "provider": "scripted", "webhook_urls": url},
    )
    html = response.content.decode()
    assert response.status_code == 400
    assert 'class="field has-error" id="field-webhook_urls"' in html
    assert "public addresses only" in html
    assert not Run.objects.exists()


def test_a_webhook_host_no_one_could_name_is_refused(owner) -> None:
    with pytest.raises(notifications.InputError, match="host name"):
        make_run(turns=[finish_turn()], webhook_urls=["http://bad_name.example/hook"])


def test_a_public_or_not_yet_resolvable_webhook_is_taken(dns) -> None:
    run = make_run(
        turns=[finish_turn()],
        webhook_urls=["https://93.184.215.14/hook", f"http://{REBINDING_NAME}/hook"],
    )
    assert len(run.webhook_urls) == 2


def deliver(run: Run, url: str) -> WebhookDelivery:
    delivery = WebhookDelivery.objects.create(
        run_id=run.pk, url=url, payload={"id": "msg_1", "event": "run.succeeded"}
    )
    tasks.deliver_webhook.call_local(delivery_id=delivery.pk)
    delivery.refresh_from_db()
    return delivery


def test_delivery_checks_again_after_resolving_and_posts_nothing_there(
    settings, dns, receiver
) -> None:
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_ATTEMPTS": 1}
    url = f"http://{REBINDING_NAME}:{receiver.port}/hook"
    run = make_run(turns=[finish_turn()], webhook_urls=[url])  # taken: it did not resolve
    dns.rebound = True
    delivery = deliver(run, url)  # now it resolves to this machine
    assert receiver.bodies == []
    assert delivery.failed_at is not None and delivery.delivered_at is None
    assert "refused" in delivery.last_error and "127.0.0.1" in delivery.last_error
    failed = Event.objects.get(run=run, kind="notification.failed")
    assert "an address on this machine or a private network" in failed.payload["error"]

    # A URL that got into a run some other way (an older version, a restored backup).
    Run.objects.filter(pk=run.pk).update(webhook_urls=[f"http://127.0.0.1:{receiver.port}/x"])
    delivery = deliver(run, f"http://127.0.0.1:{receiver.port}/x")
    assert receiver.bodies == [] and delivery.failed_at is not None
    assert "refused: 127.0.0.1 resolves to 127.0.0.1" in delivery.last_error


def test_the_operators_own_webhooks_and_the_setting_may_reach_this_machine(
    settings, receiver
) -> None:
    url = f"http://127.0.0.1:{receiver.port}/hook"
    run = make_run(turns=[finish_turn()])
    # SHIFTLOG_WEBHOOK_URLS is the operator's, trusted.
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_URLS": [url]}
    assert deliver(run, url).delivered_at is not None
    # SHIFTLOG_WEBHOOK_ALLOW_PRIVATE (off by default) lets a run's own go there too.
    settings.SHIFTLOG = {**settings.SHIFTLOG, "WEBHOOK_URLS": [], "WEBHOOK_ALLOW_PRIVATE": True}
    assert make_run(turns=[finish_turn()], webhook_urls=[url]).webhook_urls == [url]
    assert deliver(run, url).delivered_at is not None
    assert len(receiver.bodies) == 2
