import runpy
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "custom_env.py"


def test_custom_env_example_runs_and_conforms():
    out = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "solved guess-100-" in out.stdout and "return 1.0" in out.stdout


def test_custom_env_truncates_without_guess():
    mod = runpy.run_path(str(EXAMPLE))
    env = mod["GuessNumberEnv"](max_turns=2)
    env.reset(seed=0)
    env.step('<tool_call>{"name": "is_above", "arguments": {"value": 500}}</tool_call>')
    obs, r, term, trunc, info = env.step(
        '<tool_call>{"name": "is_above", "arguments": {"value": 50}}</tool_call>'
    )
    assert trunc and not term and r == 0.0
    assert info["invalid_action"] is False
