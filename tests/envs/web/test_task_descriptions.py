"""Every MiniWoB task has a description (no browser): the wheel's docstring, else the page's instruction."""

from __future__ import annotations

from typer.testing import CliRunner

from turngym.envs.web.tasks import all_tasks, page_instruction

NO_ENV_CLASS = {  # tasks the wheel ships a page for but no environment class (so no docstring)
    "button-delay": "Click button ONE, then click button TWO.",
    "chase-circle": "Keep your mouse inside the circle as it moves around.",
    "hover-shape": "Keep the mouse hovered over the colored square.",
    "moving-items": "Click as many moving circles as possible.",
    "simon-says": "Push the buttons in the order displayed.",  # written by the page's script
}


def test_every_task_has_a_description():
    tasks = all_tasks()
    assert len(tasks) == 130
    assert [name for name, t in tasks.items() if not t.description.strip()] == []
    for name, text in NO_ENV_CLASS.items():
        assert tasks[name].description == text
    assert tasks["click-button"].description.startswith("Click on a specific button")  # docstrings first


def test_miniwob_tasks_command_lists_the_descriptions():
    from turngym.cli import app

    res = CliRunner().invoke(app, ["web", "miniwob-tasks"], terminal_width=400)
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "simon-says" in ln)
    assert "Push the buttons" in line


def test_page_instruction_reads_the_static_text_or_the_script_literal(tmp_path):
    page = tmp_path / "t.html"
    page.write_text(
        '<div id="wrap"><div id="query">Click <span>the</span> &quot;OK&quot;\n button.</div></div>'
    )
    assert page_instruction(page) == 'Click the "OK" button.'
    page.write_text(
        "<script>var f = function() { $('#query').html('Hi ' + name);\n"
        '  d3.select("#query").html("Push <b>the</b> buttons."); }</script>\n<div id="query"></div>'
    )
    assert page_instruction(page) == "Push the buttons."
    page.write_text("<div id='area'></div>")
    assert page_instruction(page) == ""
