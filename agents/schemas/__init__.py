"""JSON Schemas of what people hand Shiftlog as JSON (scripts, tool policies), published as
files beside this module, and one readable message for the first thing wrong with a document.

The schema is the check: a document that passes it cannot crash what reads it later.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema

FOLDER = Path(__file__).resolve().parent
_JSON_TYPES = {
    dict: "an object",
    list: "a list",
    str: "text",
    bool: "true or false",
    int: "a whole number",
    float: "a number",
    type(None): "null",
}
_TYPE_NAMES = {
    "object": "an object",
    "array": "a list",
    "string": "text",
    "boolean": "true or false",
    "integer": "a whole number",
    "number": "a number",
    "null": "null",
}


@cache
def schema(name: str) -> dict[str, Any]:
    return json.loads((FOLDER / f"{name}.schema.json").read_text())


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(schema(name))


def where(path) -> str:
    """A JSON path as people write it: turns[3].usage.input_tokens."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def describe(error: jsonschema.ValidationError, *, skip: int = 0, whole: str = "") -> str:
    """One sentence for a schema error, without echoing a (possibly huge) value. `skip` leaves
    the first parts of its path out (the caller names them); `whole` names the document."""
    at = where(list(error.absolute_path)[skip:]) or whole or "the document"
    kind = error.validator
    if kind == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        return f"{at}: missing required field '{missing[0]}'"
    if kind == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(k for k in error.instance if k not in allowed)
        return f"{at}: unexpected field '{extra[0]}' (allowed: {', '.join(allowed)})"
    if kind == "type":
        wanted = error.validator_value
        wanted = [wanted] if isinstance(wanted, str) else wanted
        names = " or ".join(_TYPE_NAMES.get(w, w) for w in wanted)
        got = _JSON_TYPES.get(type(error.instance), type(error.instance).__name__)
        return f"{at} must be {names}, not {got}"
    if kind == "enum":
        return f"{at} must be one of: {', '.join(map(str, error.validator_value))}"
    if kind in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        relation = {"minimum": "at least", "maximum": "at most",
                    "exclusiveMinimum": "more than", "exclusiveMaximum": "less than"}[kind]  # fmt: skip
        return f"{at} must be {relation} {error.validator_value}"
    if kind in ("minItems", "minLength", "minProperties") and error.validator_value == 1:
        return f"{at} must not be empty"
    if kind in ("maxItems", "maxLength"):
        return f"{at} is too long (at most {error.validator_value})"
    if kind == "anyOf" and error.schema.get("anyOf") and "text" in json.dumps(error.schema):
        return f"{at} needs text or at least one tool call"
    message = error.message if len(error.message) <= 200 else error.message[:200] + "…"
    return f"{at}: {message}"


def first_problem(name: str, document: Any) -> jsonschema.ValidationError | None:
    """The first thing wrong with `document` under schema `name`, in document order (within
    a `oneOf`, the closest alternative's), or None when it is valid."""
    errors = sorted(validator(name).iter_errors(document), key=lambda e: list(map(str, e.path)))
    if not errors:
        return None
    return jsonschema.exceptions.best_match([errors[0]])


def first_error(name: str, document: Any) -> str | None:
    """What is wrong with `document` under schema `name`, in a sentence, or None."""
    problem = first_problem(name, document)
    return describe(problem) if problem is not None else None
