"""``turngym proxy`` as a process: serves the model behind its token; unsafe binds are refused."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "cli-test-token-0123456789"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "TURNGYM_PROXY_TOKEN": TOKEN}


@pytest.mark.slow
def test_turngym_proxy_serves_records_and_requires_its_token(tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "turngym.cli", "proxy", "--model", "tiny", "--port", str(port),
           "--out", str(tmp_path), "--max-tokens", "4", "--max-context", "512"]  # fmt: skip
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.2)
        client = openai.OpenAI(base_url=url + "/v1/episodes/cli-1", api_key=TOKEN, max_retries=0, timeout=120)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert r.usage.completion_tokens <= 4
        assert httpx.post(url + "/v1/episodes/cli-1/reward", json={"reward": 1}).status_code == 401
        ok = httpx.post(url + "/v1/episodes/cli-1/reward", json={"reward": 1},
                        headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)  # fmt: skip
        assert ok.json()["status"] == "finished"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)
    assert TOKEN not in out  # a token from the environment is not printed
    assert "cli-1" in (tmp_path / "trajectories.jsonl").read_text()


def test_no_token_on_a_public_bind_is_refused():
    cmd = [sys.executable, "-m", "turngym.cli", "proxy", "--model", "tiny", "--host", "0.0.0.0",
           "--insecure-no-token"]  # fmt: skip
    out = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode != 0 and "loopback" in out.stderr
