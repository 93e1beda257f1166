"""Regular expressions people give (tool policy patterns, a script's branch conditions), run on
text the agent controls, in the worker threads every run shares. They run on RE2 (google-re2),
whose time is linear in the text: no pattern can hang a worker (with `re`, `(a+)+$` against 30
`a`s and a `b` took minutes). RE2 has no backreferences and no lookaround: a pattern using them
is refused when it is saved, saying so (`PatternError`).

A pattern stored before this check that RE2 cannot compile never matches an allow rule and
always matches a deny or ask rule (`search_or`): an unreadable rule errs on the side of a
person.
"""

from __future__ import annotations

import functools

import re2

MAX_PATTERN_MEMORY = 8 << 20  # RE2's own default: a pattern larger than this is refused


class PatternError(ValueError):
    pass


@functools.lru_cache(maxsize=2048)
def compile_pattern(pattern: str, *, ignore_case: bool = False) -> re2._Regexp:
    """The compiled pattern, or PatternError saying why RE2 refuses it."""
    options = re2.Options()
    options.log_errors = False  # the reason is in the error; nothing on the worker's stderr
    options.max_mem = MAX_PATTERN_MEMORY
    options.case_sensitive = not ignore_case
    try:
        return re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise PatternError(
            f"{why} (patterns run on RE2, in time linear in the text: no backreferences, "
            "no lookahead or lookbehind)"
        ) from None


def search(pattern: str, text: str, *, ignore_case: bool = False) -> bool:
    return compile_pattern(pattern, ignore_case=ignore_case).search(text) is not None


def search_or(pattern: str, text: str, *, unreadable: bool, ignore_case: bool = False) -> bool:
    """`search`, or `unreadable` when the pattern is one RE2 refuses (stored before it was)."""
    try:
        return search(pattern, text, ignore_case=ignore_case)
    except PatternError:
        return unreadable
