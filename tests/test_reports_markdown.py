"""The harness's own Markdown (handoff notes, the checks report) renders as it reads: lists stay
lists, raw output stays verbatim."""

from __future__ import annotations

from agents import done_conditions
from agents.runtime import prompts
from dashboard import markup


def test_a_handoff_renders_its_lists_as_lists():
    handoff = {
        "summary": "Wrote the module.",
        "done": ["textstats.py with word_count", "tests for it"],
        "next_steps": ["add top_words"],
        "open_questions": [],
    }
    html = markup.markdown_html(prompts.handoff_markdown(handoff))
    assert "<h2>Done</h2>" in html and "<h2>Next steps</h2>" in html
    assert "<li>textstats.py with word_count</li>" in html and "<li>add top_words</li>" in html
    assert "Open questions" not in html  # an empty list gets no heading
    assert html.count("<ul>") == 2


def test_a_failed_checks_output_is_fenced_verbatim():
    output = (
        "Traceback (most recent call last):\n"
        '  File "t.py", line 3, in <module>\n'
        "    assert word_count('a b') == 3\n"
        "AssertionError\n"
        "----------------------------------------------------------------------\n"
        "Ran 2 tests in 0.001s\n"
        "```not a fence end\n"
        "* not a list\n"
    )
    text = done_conditions.summary(
        [
            {"command": "python -m unittest", "passed": False, "timed_out": False,
             "exit_code": 1, "output": output},
            {"command": "true", "passed": True, "timed_out": False, "exit_code": 0, "output": ""},
        ]
    )  # fmt: skip
    html = markup.markdown_html(f"# Done-conditions\n\n{text}\n")
    assert "<hr" not in html  # the dashes are output, not a rule
    assert html.count("<pre>") == 1
    block = html.split("<pre>")[1].split("</pre>")[0]
    # Every line of the output is in the block, in order, as it was (escaped).
    assert "    assert word_count(&#x27;a b&#x27;) == 3" in block or (
        "    assert word_count('a b') == 3" in block
    )
    assert "-" * 70 in block and "```not a fence end" in block and "* not a list" in block
    assert "PASSED <code>true</code>" in html and "<li>" in html


def test_the_fence_outgrows_any_backticks_in_the_output():
    assert done_conditions.fenced("a ```` b").startswith("`````text\n")
    assert done_conditions.fenced("plain").startswith("```text\n")
