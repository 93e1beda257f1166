"""The walk over tree-sitter's statements: lists, pipelines, compound commands, functions,
assignments, declarations, tests, redirections, and the commands inside substitutions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import tree_sitter

from agents.shell.commands import _simple
from agents.shell.data import Redirect, Word
from agents.shell.programs import SPECIAL_VARIABLES
from agents.shell.state import _parser, _State
from agents.shell.words import _WORDISH, _arithmetic, _word

MAX_DEPTH = 20  # nested substitutions beyond this are opaque

_OPERATORS = frozenset({"&&", "||", ";", "|", "|&", "&", ";;", "\n"})


def _walk_statements(node: tree_sitter.Node, state: _State) -> None:
    """A node holding statements: program, list, pipeline, compound_statement, do_group …"""
    named = 0
    for child in node.children:
        if not child.is_named:
            if child.type in _OPERATORS:
                state.operators.append(child.type)
            continue
        if child.type == "comment":
            continue
        named += 1
        _statement(child, state)
    if node.type == "program" and named > 1:
        state.operators.append(";")


def _statement(node: tree_sitter.Node, state: _State) -> None:
    kind = node.type
    if node.has_error or node.is_missing or kind == "ERROR":
        state.unreadable("it does not parse")
        return
    if kind == "command":
        _command(node, state)
    elif kind == "redirected_statement":
        body, *redirects = node.children
        if body.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            redirects = [body, *redirects]
        else:
            _statement(body, state)
        for r in redirects:
            _redirect(r, state)
    elif kind in ("list", "pipeline"):
        _walk_statements(node, state)
    elif kind in ("compound_statement", "do_group", "else_clause", "elif_clause"):
        if node.children and node.children[0].type == "((":
            state.operators.append("arithmetic")
            for child in node.named_children:
                _arithmetic(child, state)
            return
        _walk_statements(node, state)
    elif kind == "subshell":
        state.operators.append("subshell")
        saved = state.cwd
        _walk_statements(node, state)
        state.cwd = saved
    elif kind == "negated_command":
        state.operators.append("!")
        _walk_statements(node, state)
    elif kind in ("if_statement", "while_statement"):
        state.operators.append("if" if kind == "if_statement" else "while")
        _walk_statements(node, state)
    elif kind == "for_statement":
        state.operators.append("for")
        body = [c for c in node.named_children if c.type == "do_group"]
        for child in node.named_children:
            if child.type in _WORDISH:
                _word(child, state)
        for child in body:
            _statement(child, state)
    elif kind == "c_style_for_statement":
        state.operators.append("for")
        for child in node.named_children:
            if child.type == "do_group" or child.type == "compound_statement":
                _statement(child, state)
            else:
                _arithmetic(child, state)
    elif kind == "case_statement":
        state.operators.append("case")
        for child in node.named_children:
            if child.type == "case_item":
                for item in child.named_children:
                    if item.type in _WORDISH:
                        _word(item, state)
                    elif item.type != "extglob_pattern":
                        _statement(item, state)
            else:
                _word(child, state)
    elif kind == "function_definition":
        state.operators.append("function")
        for child in node.named_children:
            if child.type != "word":
                _statement(child, state)
    elif kind in ("variable_assignment", "variable_assignments"):
        _assignments(node, state)
    elif kind == "declaration_command":
        _declaration(node, state)
    elif kind == "unset_command":
        for child in node.named_children:
            if child.type in _WORDISH:
                _word(child, state)
    elif kind == "test_command":
        _test(node, state)
    elif kind in _WORDISH:  # a statement that is only an expansion: `$x`
        state.unreadable("the program is only known when it runs")
        _word(node, state)
    else:
        state.unreadable(f"shell syntax this reader does not know ({kind})")


def _command(node: tree_sitter.Node, state: _State) -> None:
    words: list[Word] = []
    redirects: list[tree_sitter.Node] = []
    assigns: list[str] = []
    previous: tree_sitter.Node | None = None
    for child in node.children:
        if previous is not None and (split := _split_differently(previous, child, state)):
            state.unreadable(split)
        previous = child
        if child.type == "variable_assignment":
            _assignments(child, state, prefix=True)
            assigns.append(state.text(child).split("=", 1)[0])
            continue
        if child.type in ("file_redirect", "heredoc_redirect", "herestring_redirect"):
            redirects.append(child)
            continue
        if child.type == "comment":
            if child != node.children[-1]:
                state.unreadable("a command the parser continues after a comment")
            continue
        if child.type == "command_name":
            child = child.named_children[0] if child.named_children else child
        if not child.is_named or child.type not in _WORDISH:
            state.unreadable(f"a word this reader does not know ({child.type!r})")
            continue
        words.append(_word(child, state))
    for r in redirects:
        _redirect(r, state)
    if words:
        _simple(words, state, source=state.text(node), assigns=assigns)


def _split_differently(a: tree_sitter.Node, b: tree_sitter.Node, state: _State) -> str:
    """Why the shell would not read `a` and `b` as two words of one command, or "": no blank
    between them (one word to the shell, two to the parser), or a line break that ends the
    command (the parser took newline + backslash-newline for a continuation)."""
    gap = state.source[a.end_byte : b.start_byte].replace(b"\\\n", b"")
    if b"\n" in gap:
        return "a line break the parser reads as part of the command"
    if gap.strip():
        return "text the parser skipped"
    words = ("command_name", "variable_assignment", *_WORDISH)
    if not gap and a.type in words and b.type in words:
        return "words the shell joins and the parser splits"
    return ""


def _assignments(node: tree_sitter.Node, state: _State, *, prefix: bool = False) -> None:
    """`X=v`: HOME, IFS … set for the rest of the command change how it reads words; set only for
    one command (`IFS= read -r line`) they do not: its words are read before the assignment."""
    assignments = [node] if node.type == "variable_assignment" else node.named_children
    for a in assignments:
        if a.type != "variable_assignment":
            continue
        target = a.child_by_field_name("name") or (a.named_children or [None])[0]
        if target is not None and target.type == "subscript":
            _arithmetic(target, state)
            name = state.text(target.named_children[0]) if target.named_children else ""
        else:
            name = state.text(target) if target is not None else ""
        if name in SPECIAL_VARIABLES and not prefix:
            state.unreadable(f"it sets {name}, which changes how the shell reads words")
        value = a.child_by_field_name("value")
        if value is None:
            continue
        if value.type == "array":
            for item in value.named_children:
                _word(item, state) if item.type in _WORDISH else None
        elif value.type in _WORDISH:
            _word(value, state)
        else:
            state.unreadable(f"shell syntax this reader does not know ({value.type})")


def _declaration(node: tree_sitter.Node, state: _State) -> None:
    keyword = node.children[0].type if node.children else ""
    words = []
    for child in node.named_children:
        if child.type == "variable_assignment":
            _assignments(child, state)
        elif child.type in _WORDISH:
            words.append(_word(child, state))
        elif child.type != "variable_name":
            state.unreadable(f"shell syntax this reader does not know ({child.type})")
    if any(w.value and re.fullmatch(r"-\w*n\w*", w.value) for w in words):
        state.unreadable("declare -n makes a variable name another")
    if any(w.value is None for w in words):
        state.unreadable(f"{keyword}'s arguments are only known when it runs")


def _test(node: tree_sitter.Node, state: _State) -> None:
    """[ … ] and [[ … ]]: only their substitutions run; [[ -eq ]] evaluates arithmetic."""
    double = bool(node.children) and node.children[0].type == "[["
    for child in _descendants(node):
        if child.type in _RUNS_OR_EXPANDS:
            _word(child, state)
        elif child.type == "ERROR":
            state.unreadable("it does not parse")
        elif double and child.type == "binary_expression":
            ops = [c for c in child.children if c.type == "test_operator"]
            if ops and state.text(ops[0]) in ("-eq", "-ne", "-lt", "-le", "-gt", "-ge"):
                for side in child.named_children:
                    if side.type != "test_operator":
                        _arithmetic(side, state)


_RUNS_OR_EXPANDS = frozenset(
    {"command_substitution", "process_substitution", "arithmetic_expansion", "expansion"}
    | {"simple_expansion"}
)


def _descendants(node: tree_sitter.Node) -> Iterator[tree_sitter.Node]:
    """Every node below, not looking into words that _word reads whole."""
    for child in node.children:
        yield child
        if child.type not in _RUNS_OR_EXPANDS:
            yield from _descendants(child)


def _redirect(node: tree_sitter.Node, state: _State) -> None:
    op = ""
    fd = ""
    target: Word | None = None
    for child in node.children:
        if child.type == "file_descriptor":
            fd = state.text(child)
        elif not child.is_named:
            op = op or child.type
        elif child.type == "heredoc_body":
            _heredoc_body(child, state)
        elif child.type in ("file_redirect", "herestring_redirect", "heredoc_redirect"):
            _redirect(child, state)
        elif child.type in ("heredoc_start", "heredoc_end", "heredoc_content"):
            continue
        elif child.type in _WORDISH and target is None:
            target = _word(child, state)
        elif child.type in _WORDISH:
            _word(child, state)  # `cat <<< a b`: only the first is the target, all are read
        else:
            state.unreadable(f"a redirection this reader does not know ({child.type})")
    if node.type == "heredoc_redirect":
        target = Word("(here-document)", ("",))
    if target is None:
        state.unreadable("a redirection without a target")
        return
    state.redirects.append(Redirect(op, target, state.cwd, fd))


def _heredoc_body(node: tree_sitter.Node, state: _State) -> None:
    """An unquoted here-document's substitutions run; its variables are only data."""
    for child in node.named_children:
        if child.type in ("command_substitution", "arithmetic_expansion", "expansion"):
            _word(child, state)


def _substitution(node: tree_sitter.Node, state: _State) -> None:
    """The commands a substitution runs are commands too; a backquoted one is read again."""
    if state.depth >= MAX_DEPTH:
        state.unreadable("substitutions nested too deep")
        return
    saved_cwd, saved_context = state.cwd, state.context
    state.depth += 1
    state.operators.append("substitution")
    state.context = state.context or node.type.replace("_", " ")
    try:
        text = state.text(node)
        if text.startswith("`"):
            inner = re.sub(r"\\([$`\\])", r"\1", text[1:-1])
            _walk_statements(_parser().parse(inner.encode()).root_node, _backquoted(state, inner))
        else:
            for child in node.named_children:
                if child.type != "comment":
                    _statement(child, state)
    finally:
        state.depth -= 1
        state.cwd, state.context = saved_cwd, saved_context


def _backquoted(state: _State, text: str) -> _State:
    """The state for reading a backquoted substitution's own text (read again, unescaped):
    the same lists, so what it finds is recorded with the rest."""
    return _State(
        state.workspace,
        text.encode(),
        state.substitution,
        cwd=state.cwd,
        commands=state.commands,
        operators=state.operators,
        redirects=state.redirects,
        opaque=state.opaque,
        numeric=state.numeric,
        depth=state.depth,
        context=state.context,
    )
