"""Words as tree-sitter gives them: strings, expansions, substitutions and arithmetic, read
into the parts agents.shell.expand turns into values. Arithmetic may only name variables known
to be numbers, since it evaluates their values again.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import tree_sitter

from agents.shell.data import Word
from agents.shell.expand import _ansi_c, _double_quoted, _expand, _Part, _unquoted
from agents.shell.paths import HOME
from agents.shell.state import _State

# The node kinds that are one word of a command.
_WORDISH = frozenset(
    {"word", "string", "raw_string", "concatenation", "simple_expansion", "expansion"}
    | {"command_substitution", "process_substitution", "number", "ansi_c_string"}
    | {"translated_string", "brace_expression", "arithmetic_expansion"}
)
_SAFE_EXPANSION_OPS = frozenset(
    {":-", "-", ":=", "=", ":?", "?", ":+", "+", "#", "##", "%", "%%", "/", "//", "/#", "/%"}
    | {"^", "^^", ",", ",,"}
)
_NUMBER = re.compile(r"\d+|0[xX][0-9a-fA-F]+|\d+#[0-9a-zA-Z@_]+")
_NUMERIC_SPECIALS = frozenset({"#", "?", "$", "!", "RANDOM", "SECONDS", "LINENO", "BASHPID"})
_NUMERIC_SPECIALS |= {"PPID", "UID", "EUID", "SHLVL", "COLUMNS", "LINES", "OPTIND"}


def _numeric_variables(root: tree_sitter.Node, state: _State) -> set[str]:
    """Variables this command only ever sets to plain numbers (safe inside arithmetic)."""
    numeric: set[str] = set()
    other: set[str] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.type == "variable_assignment":
            target = node.named_children[0] if node.named_children else None
            if target is None or target.type != "variable_name":
                continue
            value = node.child_by_field_name("value")
            is_number = value is not None and (
                value.type in ("number", "arithmetic_expansion")
                or (value.type == "word" and _NUMBER.fullmatch(state.text(value)) is not None)
            )
            (numeric if is_number else other).add(state.text(target))
        elif node.type == "for_statement":
            target = node.child_by_field_name("variable")
            if target is not None:
                other.add(state.text(target))
        elif (
            node.type == "command"
            and node.named_children
            and state.text(node.named_children[0])
            in ("read", "getopts", "printf", "mapfile", "readarray")
        ):
            for child in node.named_children[1:]:  # variables set from input
                if child.type == "word" and re.fullmatch(r"[A-Za-z_]\w*", state.text(child)):
                    other.add(state.text(child))
    return numeric - other


def _arithmetic(node: tree_sitter.Node, state: _State) -> None:
    """Arithmetic evaluates the values of the variables it names as arithmetic again; a value
    like `a[$(cmd)]` would run cmd. So every variable must be one this command sets to numbers."""
    stack = [node]
    while stack:
        n = stack.pop()
        kind = n.type
        if kind in ("command_substitution", "process_substitution"):
            state.unreadable("a command substitution inside arithmetic")
            _word(n, state)
            continue
        if kind == "ERROR":
            state.unreadable("it does not parse")
            continue
        if kind in ("variable_name", "special_variable_name"):
            names = [state.text(n)]
        elif kind == "word":
            names = [t for t in re.findall(r"[\w#@]+", state.text(n)) if not _NUMBER.fullmatch(t)]
        else:
            names = []
        for name in names:
            if name not in state.numeric and name not in _NUMERIC_SPECIALS:
                state.unreadable(f"arithmetic on ${name}, whose value is not a known number")
        if kind in ("variable_name", "special_variable_name", "word"):
            continue
        if kind in ("string", "raw_string", "ansi_c_string", "translated_string"):
            state.unreadable("text inside arithmetic")
            continue
        stack.extend(n.children)


def _word(node: tree_sitter.Node, state: _State) -> Word:
    """A word as the shell reads it: its values, or why it cannot be known."""
    parts = list(_parts(node, state, quoted=False))
    for i, part in enumerate(parts):
        after = parts[i + 1] if i + 1 < len(parts) else ("", "", "q")
        braced = after[0] == "lit" and not after[2] and after[1].startswith("{")
        if part[0] in ("pwd", "home") and braced:  # braces expand first: $HOME{x,} is $HOMEx
            parts[i] = ("unk", "a $NAME followed by braces")
            continue
        if part[0] == "pwd":  # $PWD is where it runs only at the start of a word
            parts[i] = ("lit", ".", "q") if i == 0 else ("unk", "$PWD inside a word")
        elif part[0] == "home":
            parts[i] = ("lit", HOME, "q")
    values, unknown, globs = _expand(parts)
    return Word(state.text(node), values, unknown, globs)


def _parts(node: tree_sitter.Node, state: _State, *, quoted: bool) -> Iterator[_Part]:
    kind = node.type
    text = state.text(node)
    if kind in ("word", "number"):
        if re.search(r"(?<!\\)(?:\\\\)*\n", text):
            state.unreadable("a line break the parser reads as part of a word")
        if quoted:
            yield ("lit", text, "q")
        else:
            yield from _unquoted(text)
    elif kind == "raw_string":
        yield ("lit", text[1:-1], "q")
    elif kind == "ansi_c_string":
        yield ("alt", _ansi_c(text[2:-1]), "$" + text[2:-1])
    elif kind == "translated_string":
        inner = text[2:-1]
        yield ("alt", _double_quoted(inner), "$" + _double_quoted(inner))
        if "$" in inner or "`" in inner:
            yield ("unk", 'an expansion inside $"…"')
    elif kind == "string":
        yield from _string(node, state)
    elif kind == "concatenation":
        previous = None
        for child in node.children:
            if previous is not None and previous.end_byte != child.start_byte:
                state.unreadable("words the shell joins and the parser splits")
            previous = child
            if not child.is_named:
                state.unreadable(f"a word this reader does not know ({child.type!r})")
                yield ("unk", "unreadable")
                continue
            yield from _parts(child, state, quoted=quoted)
    elif kind == "brace_expression":
        yield ("lit", text, "q" if quoted else "")
    elif kind == "simple_expansion" or kind == "expansion":
        yield from _expansion(node, state)
    elif kind == "command_substitution":
        state.substitution(node, state)
        yield ("unk", "command substitution")
    elif kind == "process_substitution":
        state.substitution(node, state)
        yield ("unk", "process substitution")
    elif kind == "arithmetic_expansion":
        for child in node.named_children:
            _arithmetic(child, state)
        yield ("unk", "arithmetic")
    else:
        state.unreadable(f"a word this reader does not know ({kind})")
        yield ("unk", kind)


def _first_part(node: tree_sitter.Node) -> bool:
    """The node starts the word it is in (nothing before it in its concatenation or string)."""
    while node.parent is not None and node.parent.type in ("concatenation", "string"):
        first = node.parent.children[0]
        if node.parent.type == "string":
            if node.start_byte != node.parent.start_byte + 1:
                return False
        elif first.start_byte != node.start_byte:
            return False
        node = node.parent
    return True


def _string(node: tree_sitter.Node, state: _State) -> Iterator[_Part]:
    """ "…": the text between its expansions is taken from the source, so nothing is skipped."""
    inner = [c for c in node.children if c.is_named]
    start = node.start_byte + 1
    for child in inner:
        if child.type == "string_content":
            continue
        if child.start_byte > start:
            literal = state.source[start : child.start_byte].decode("utf-8", "replace")
            yield ("lit", _double_quoted(literal), "q")
        yield from _parts(child, state, quoted=True)
        start = child.end_byte
    end = node.end_byte - 1
    if end > start:
        yield ("lit", _double_quoted(state.source[start:end].decode("utf-8", "replace")), "q")


def _expansion(node: tree_sitter.Node, state: _State) -> Iterator[_Part]:
    named = node.named_children
    ops = [c.type for c in node.children if not c.is_named and c.type not in ("$", "${", "}")]
    name = state.text(named[0]) if named and named[0].type in ("variable_name",) else ""
    if node.type == "simple_expansion" or (not ops and len(named) == 1 and name):
        if name == "HOME":
            yield ("home",) if node.type == "simple_expansion" else ("lit", HOME, "q")
            return
        if name == "PWD":
            if state.cwd is None:
                yield ("unk", "$PWD after a cd somewhere unknown")
            elif node.type == "simple_expansion":
                yield ("pwd",)
            else:
                yield ("lit", ".", "q") if _first_part(node) else ("unk", "$PWD inside a word")
            return
        if named and named[0].type not in ("variable_name", "special_variable_name"):
            state.unreadable(f"a word this reader does not know ({named[0].type})")
        yield ("unk", f"${name or state.text(node)[1:]}")
        return
    if any(op not in _SAFE_EXPANSION_OPS for op in ops) or any(
        c.type == "subscript" for c in named
    ):
        bad = [op for op in ops if op not in _SAFE_EXPANSION_OPS] or ["[…]"]
        state.unreadable(f"an expansion that evaluates its text ({bad[0]})")
    for child in named[1:]:
        if child.type in _WORDISH:
            _word(child, state)  # ${x:-$(cmd)} runs cmd when x is empty
    yield ("unk", state.text(node))
