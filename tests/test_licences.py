"""Shiftlog is Apache-2.0 (pyproject.toml, LICENSE): no runtime dependency may be GPL or AGPL.

The closure is read from the installed metadata (importlib.metadata), from `shiftlog`'s own
requirements down, without the dev or bench extras; each distribution's License-Expression, License
and `License ::` classifiers are read. A dependency that declares no licence at all must be named
in REVIEWED, with what its licence file says, so a new one cannot slip through undeclared."""

from __future__ import annotations

import importlib.metadata as md
import re

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

pytestmark = pytest.mark.no_services  # pure code: no database, queue or channel layer

# Distributions whose metadata names no licence, read by hand from their licence file.
REVIEWED = {"huey": "MIT"}

# GPL or AGPL, any version, but not the LGPL (a library licence an Apache-2.0 program may link).
_COPYLEFT_ID = re.compile(r"(?<![A-Za-z])A?GPL(?![-\s]?compatible)", re.IGNORECASE)
_COPYLEFT_NAME = re.compile(r"GNU (Affero )?General Public License", re.IGNORECASE)


def runtime_closure(root: str = "shiftlog", extras: frozenset[str] = frozenset({"all"})):
    """Every distribution `root` may need at run time: its requirements with the extras of its
    backends (`all`: PostgreSQL, Redis, S3, OTLP, Claude; not dev or bench), and down the tree
    each requirement with the extras asked of it (`psycopg[binary]`)."""
    seen: dict[str, md.Distribution] = {}
    done: set[tuple[str, str]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, extras)]
    while todo:
        name, extras = todo.pop()
        name = canonicalize_name(name)
        if name not in seen:
            seen[name] = md.distribution(name)
        for extra in {"", *extras}:
            if (name, extra) in done:
                continue
            done.add((name, extra))
            for spec in seen[name].requires or []:
                req = Requirement(spec)
                if req.marker is None or req.marker.evaluate({"extra": extra}):
                    todo.append((req.name, frozenset(req.extras)))
    return seen


def declared(dist: md.Distribution) -> list[str]:
    meta = dist.metadata
    texts = [meta.get("License-Expression") or "", meta.get("License") or ""]
    texts += [c for c in meta.get_all("Classifier") or [] if c.startswith("License ::")]
    return [t for t in texts if t.strip() and t.strip().upper() != "UNKNOWN"]


def copyleft(texts: list[str]) -> list[str]:
    return [t[:80] for t in texts if _COPYLEFT_ID.search(t) or _COPYLEFT_NAME.search(t)]


@pytest.mark.parametrize(
    ("texts", "bad"),
    [
        (["GPL-2.0-or-later"], True),  # merge3's
        (["License :: OSI Approved :: GNU General Public License v2 or later (GPLv2+)"], True),
        (["AGPL-3.0-only"], True),
        (["License :: OSI Approved :: GNU Affero General Public License v3"], True),
        (["GNU GPL v3"], True),
        (["LGPL-3.0-only"], False),  # psycopg's
        (["License :: OSI Approved :: GNU Lesser General Public License v3 (LGPLv3)"], False),
        (["PSF-2.0", "... this License Agreement is GPL-compatible ..."], False),
        (["Apache-2.0 OR BSD-3-Clause", "License :: OSI Approved :: MIT License"], False),
    ],
)
def test_the_check_tells_gpl_and_agpl_from_the_rest(texts, bad):
    assert bool(copyleft(texts)) is bad


def test_shiftlog_declares_apache_2():
    assert md.distribution("shiftlog").metadata.get("License-Expression") == "Apache-2.0"


def test_no_runtime_dependency_is_gpl_or_agpl_and_each_declares_a_licence():
    closure = runtime_closure()
    # The walk reached the real tree, extras of requirements included (psycopg[binary]).
    assert "django" in closure and "psycopg-binary" in closure and len(closure) > 20
    gpl = {name: copyleft(declared(d)) for name, d in closure.items()}
    assert {name: texts for name, texts in gpl.items() if texts} == {}
    undeclared = sorted(n for n, d in closure.items() if not declared(d) and n not in REVIEWED)
    assert undeclared == [], "read their licence files and add them to REVIEWED"
