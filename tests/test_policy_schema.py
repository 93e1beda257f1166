"""The published JSON Schemas (agents/schemas/) are the contract for what people hand in as JSON:
every rule and script the product itself writes passes them, and what breaks them is refused
with a sentence saying where."""

from __future__ import annotations

import jsonschema
import pytest

from agents import policy, schemas
from agents.providers.scripted import ScriptError, builtin_script, validate_script

pytestmark = pytest.mark.no_services


@pytest.mark.parametrize("name", ["policy", "script"])
def test_the_schemas_are_valid_draft_2020_12(name):
    jsonschema.Draft202012Validator.check_schema(schemas.schema(name))


def test_every_rule_shape_the_product_writes_passes_the_policy_schema():
    rules = [
        policy.similar_rule("bash", {"command": "rm -rf build"}),
        policy.similar_rule("bash", {"command": "git clean -fd"}),
        policy.similar_rule("bash", {"command": "python3 x && rm -rf /"}),  # exact-text rule
        policy.similar_rule("write_file", {"path": "src/a.py"}),
        policy.similar_rule("network", {"host": "pypi.org", "port": 443}),
        policy.allow_host_rule("files.example"),
        policy.network_rule("evil.example", 80, "deny"),
        {"tool": "*", "action": "ask"},
    ]
    assert schemas.first_error("policy", rules) is None
    assert policy.validate(rules)


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ([{"tool": "bash", "action": "ask"}] * 501, "at most 500"),
        ([{"tool": "x" * 101, "action": "ask"}], "rule 1: tool is too long"),
        ([{"tool": "bash", "action": "ask", "note": "n" * 2001}], "rule 1: note is too long"),
        (
            [{"tool": "bash", "action": "allow", "program": "rm", "args": ["a"] * 21}],
            "rule 1: args is too long",
        ),
    ],
)
def test_what_breaks_the_policy_schema_is_refused_saying_where(rules, message):
    with pytest.raises(policy.PolicyError, match=message):
        policy.validate(rules)


def test_the_demo_script_passes_the_script_schema_and_a_broken_one_does_not():
    assert validate_script(builtin_script("demo"))
    with pytest.raises(ScriptError, match=r"turns\[1\]\.tool_calls\[0\]: unexpected field 'args'"):
        validate_script({"turns": [{"text": "a"}, {"tool_calls": [{"name": "x", "args": {}}]}]})
