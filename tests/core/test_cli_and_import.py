import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from turngym.cli import CLIError, app, parse_typed_call
from turngym.core.types import ToolSpec

runner = CliRunner()


def test_import_is_light():
    code = "import sys, turngym; print(json.dumps(sorted(m for m in ('torch','transformers','docker','playwright','vllm','ray','pandas') if m in sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", "import json;" + code], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == []


def test_the_cli_imports_no_server_or_model_stack():
    """``turngym train`` on a machine without the interop extra: registering every command (serve,
    proxy, ...) imports none of their servers' dependencies."""
    code = (
        "import sys, json, turngym.cli; print(json.dumps(sorted(m for m in ('fastapi', 'uvicorn', "
        "'starlette', 'openai', 'mcp', 'torch', 'transformers') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_envs_json():
    r = runner.invoke(app, ["envs", "--json"])
    assert r.exit_code == 0
    ids = [row["id"] for row in json.loads(r.stdout)]
    assert "arith-v0" in ids


def test_info_and_check():
    r = runner.invoke(app, ["info", "arith"])
    assert r.exit_code == 0 and "calculate" in r.stdout
    r = runner.invoke(app, ["check", "arith", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)[0]["ok"] is True


def test_play_expert_and_typed_input():
    r = runner.invoke(app, ["play", "arith", "--expert", "-n", "2"])
    assert r.exit_code == 0 and "2/2 episodes with positive return" in r.stdout
    r = runner.invoke(app, ["play", "arith", "--env-arg", "depth=1"], input="answer 0\n")
    assert r.exit_code == 0 and "terminated" in r.stdout


def test_errors_are_one_line_with_nonzero_exit():
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", "info", "no-such-env"], capture_output=True, text=True
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith("error: unknown env 'no-such-env'")
    assert len(out.stderr.strip().splitlines()) == 1


def test_parse_typed_call():
    tools = [ToolSpec(name="search", parameters={"type": "object", "properties": {"query": {}, "k": {}}})]
    assert json.loads(parse_typed_call('search("a b", k=2)', tools)[11:-12]) == {
        "name": "search",
        "arguments": {"query": "a b", "k": 2},
    }
    assert json.loads(parse_typed_call("search cats and dogs", tools)[11:-12])["arguments"] == {
        "query": "cats and dogs"
    }
    assert parse_typed_call("<answer>x</answer>", tools) == "<answer>x</answer>"
    with pytest.raises(CLIError):
        parse_typed_call("search(", tools)


def test_typed_calls_are_written_in_the_envs_own_convention():
    from turngym.core.types import Message
    from turngym.tools.parsers import get_parser

    tools = [ToolSpec(name="search", parameters={"type": "object", "properties": {"query": {}}})]
    # search-r1's tag protocol: the same typed call becomes <search>...</search>
    tags = get_parser("tags")
    action = parse_typed_call("search cats", tools, tags)
    assert [(c.name, c.arguments) for c in tags.parse(action).valid_calls] == [("search", {"query": "cats"})]
    # a JSON call is read, not pasted: a bad one is a clear error
    assert parse_typed_call('{"name": "search", "arguments": {"query": "x"}}', tools, tags) == action.replace(
        "cats", "x"
    )
    with pytest.raises(CLIError, match="cannot read"):
        parse_typed_call('{"arguments": {}}', tools)
    # a structured-call parser gets a Message with tool_calls
    msg = parse_typed_call("search(query='q')", tools, get_parser("openai"))
    assert isinstance(msg, Message) and msg.tool_calls[0].arguments == {"query": "q"}


def test_check_without_targets_names_the_envs_that_need_arguments():
    from turngym.core.registry import spec
    from turngym.sdk.commands import required_arguments

    assert required_arguments(spec("remote")) == ["url"]  # a server's address: no default exists
    assert required_arguments(spec("arith")) == [] and required_arguments(spec("search-r1")) == []
