"""What a word's text becomes once the shell has read it: quotes and backslashes removed,
`$'…'` decoded, braces expanded, `~` resolved (the rules are the package's docstring, Words).
Strings in, values out; agents.shell.words reads the tree-sitter nodes into these parts.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from agents.shell.paths import HOME

MAX_VALUES = 64  # a word that may become more values than this is unknown

# A word is built from parts: ("lit", text, quoted), ("alt", bash_text, sh_text), ("unk", why).
_Part = tuple[str, ...]

_ANSI_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def _ansi_c(text: str) -> str:
    """The value of bash's $'…' (without the $' and ')."""

    def one(m: re.Match[str]) -> str:
        s = m.group(1)
        if s[0] in _ANSI_ESCAPES:
            return _ANSI_ESCAPES[s[0]]
        if s[0] in "01234567":
            return chr(int(s, 8) & 0xFF)
        if s[0] in "xuU":
            return chr(int(s[1:], 16)) if len(s) > 1 else "\\" + s
        if s[0] == "c" and len(s) == 2:
            return chr(ord(s[1].upper()) ^ 0x40)
        return "\\" + s

    pattern = r"\\([0-7]{1,3}|x[0-9a-fA-F]{0,2}|u[0-9a-fA-F]{0,4}|U[0-9a-fA-F]{0,8}|c.|.)"
    return re.sub(pattern, one, text, flags=re.S)


def _unquoted(text: str) -> list[_Part]:
    """An unquoted word's text: a backslash quotes the next character, backslash-newline is gone."""
    parts: list[_Part] = []
    buf = ""
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            if buf:
                parts.append(("lit", buf, ""))
                buf = ""
            if text[i + 1] != "\n":
                parts.append(("lit", text[i + 1], "q"))
            i += 2
            continue
        buf += c
        i += 1
    if buf:
        parts.append(("lit", buf, ""))
    return parts


def _double_quoted(text: str) -> str:
    """Text inside "…": a backslash quotes only $ ` " \\ and newline."""
    return re.sub(r'\\([$`"\\\n])', lambda m: "" if m.group(1) == "\n" else m.group(1), text)


def _expand(parts: list[_Part]) -> tuple[tuple[str, ...], str, tuple[bool, ...]]:
    """The values a word's parts may become and whether each may be a glob, or ((), why, ())
    when they are only known at run time."""
    for part in parts:
        if part[0] == "unk":
            return (), part[1], ()
    variants: list[list[tuple[str, bool]]] = [[]]
    for part in parts:
        if part[0] == "lit":
            chars = [(c, bool(part[2])) for c in part[1]]
            variants = [v + chars for v in variants]
        else:  # alt: bash reads one thing, sh another
            variants = [v + [(c, True) for c in text] for v in variants for text in part[1:]]
        if len(variants) > MAX_VALUES:
            return (), "too many readings", ()
    values: dict[str, bool] = {}
    for chars in variants:
        expanded = [chars, *_braces(chars)]
        if len(expanded) > MAX_VALUES:
            return (), "too many brace expansions", ()
        for one in expanded:
            text = _tilde(one)
            glob = any(c in "*?[" and not quoted for c, quoted in one)
            values[text] = values.get(text, False) or glob
    if len(values) > MAX_VALUES:
        return (), "too many brace expansions", ()
    return tuple(values), "", tuple(values.values())


def _tilde(chars: list[tuple[str, bool]]) -> str:
    text = "".join(c for c, _ in chars)
    starts = [0]
    eq = text.find("=")
    if eq > 0 and re.fullmatch(r"[A-Za-z_]\w*", text[:eq]):
        starts.append(eq + 1)  # bash expands ~ after the = of an assignment-like word
    for start in reversed(starts):
        if start >= len(chars) or chars[start] != ("~", False):
            continue
        end = text.find("/", start)
        end = len(text) if end < 0 else end
        if any(q for _, q in chars[start:end]):
            continue
        user = text[start + 1 : end]
        home = "." if user == "+" else HOME
        text = text[:start] + home + text[end:]
    return text


def _braces(chars: list[tuple[str, bool]], budget: list[int] | None = None) -> list[list[Any]]:
    """bash's brace expansion of a word's characters (quoted ones are never syntax)."""
    budget = budget if budget is not None else [MAX_VALUES * 4]
    n = len(chars)
    for i in range(n):
        if chars[i] != ("{", False) or (i and chars[i - 1] == ("$", False)):
            continue
        depth, commas, close = 0, [], None
        for j in range(i, n):
            c, quoted = chars[j]
            if quoted or (c == "}" and j == i + 1 and depth == 1):
                continue  # quoted, or a } right after the { (bash reads `{},a}` as } and a)
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    close = j
                    break
            elif c == "," and depth == 1:
                commas.append(j)
        if close is None:
            continue  # an unmatched { is a plain character; braces after it still expand
        body = chars[i + 1 : close]
        if commas:
            cuts = [i, *commas, close]
            alternatives = [chars[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        else:
            alternatives = _sequence(body)
            if not alternatives:
                continue
        out: list[list[Any]] = []
        for alt in alternatives:
            budget[0] -= 1
            if budget[0] < 0:
                return out + [[("\0", True)]] * (MAX_VALUES + 1)
            word = chars[:i] + alt + chars[close + 1 :]
            out.extend(_braces(word, budget) or [word])
        return out
    return []


def _sequence(body: list[tuple[str, bool]]) -> list[list[tuple[str, bool]]]:
    if any(q for _, q in body):
        return []
    text = "".join(c for c, _ in body)
    m = re.fullmatch(
        r"(-?\d+)\.\.(-?\d+)(?:\.\.-?\d+)?|([A-Za-z])\.\.([A-Za-z])(?:\.\.-?\d+)?", text
    )
    if not m:
        return []
    if m.group(1) is not None:
        a, b = int(m.group(1)), int(m.group(2))
        items = [str(a), str(a + (1 if b >= a else -1)), str(b)]
    else:
        items = [m.group(3), m.group(4)]  # letters never make / or .
    return [[(c, True) for c in item] for item in dict.fromkeys(items)]
