"""One way to show dollars (agents/money.py), in every panel, list and command."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.template import Context, Template

from agents.money import usd

pytestmark = pytest.mark.no_services


def test_a_half_rounds_up_as_django_does_everywhere():
    # Python's :.4f gave $0.0160 in the budget meter while the lists' floatformat gave $0.0161.
    assert usd(Decimal("0.01605")) == "$0.0161"
    page = Template("{% load shiftlog %}{{ c|usd }} {{ c|floatformat:4 }}")
    assert page.render(Context({"c": Decimal("0.01605")})) == "$0.0161 0.0161"
    assert usd(Decimal("12.5"), 2) == "$12.50" and usd(0) == "$0.0000"
    assert usd(None) == "" and usd("not money") == ""
