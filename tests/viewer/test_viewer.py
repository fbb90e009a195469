import json
import subprocess
import sys
from pathlib import Path

import pytest

import turngym
from turngym.core.types import Message, Trajectory
from turngym.rollout.store import TrajectoryWriter
from turngym.viewer.report import build_report, outcome_of

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc0000003010100c9fe92ef0000000049454e44ae426082"
)


def play(env, seed: int, sample: int, expert: bool) -> Trajectory:
    obs, info = env.reset(seed=seed)
    t = Trajectory.start(obs, info, env_id="arith-v0", seed=seed, group=f"g{seed}", sample=sample)
    done = False
    while not done:
        action = env.expert_action() if expert else "I will just guess."
        obs, r, term, trunc, info = env.step(action)
        turn = t.record_step(Message(role="assistant", content=action), obs, r, term, trunc, info)
        turn.info["advantages"] = {"grpo": 0.5 if expert else -0.5}
        done = term or trunc
    return t


@pytest.fixture
def run_dir(tmp_path):
    env = turngym.make("arith", depth=2, max_turns=3)
    trajs = []
    for seed in range(3):
        for sample in range(2):
            trajs.append(play(env, seed, sample, expert=sample == 0))
    trajs[1].turns[0].observation.append(Message(role="user", content="<screenshot> & stuff", images=[PNG]))
    trajs[3].masked, trajs[3].mask_reason = True, "env_error: container died"
    with TrajectoryWriter(tmp_path) as w:
        for t in trajs:
            w.write(t)
    (tmp_path / "metrics.jsonl").write_text(
        "\n".join(
            json.dumps({"step": i, "reward/outcome": 0.1 * i, "reward/total": 0.2 * i}) for i in range(4)
        )
    )
    return tmp_path


def test_report_content(run_dir):
    from turngym.rollout.store import load_trajectories

    trajs = load_trajectories(run_dir)
    assert [outcome_of(t) for t in trajs] == ["success", "failure", "success", "masked", "success", "failure"]
    html = build_report(trajs, title="t")
    assert html.count('class="traj ') == 6
    assert "&lt;screenshot&gt; &amp; stuff" in html  # escaped text
    assert "data:image/png;base64," in html
    assert "A[grpo]=0.5" in html and "masked: env_error: container died" in html
    assert html.count("<svg") >= 3
    for external in ('src="http', 'href="http', "<link", "<script src"):  # self-contained
        assert external not in html


@pytest.mark.browser
@pytest.mark.slow
def test_report_in_headless_chromium(run_dir):
    out = subprocess.run(
        [sys.executable, "-m", "turngym.cli", "view", str(run_dir)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    report = run_dir / "report.html"
    assert report.exists()
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
            ],
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(report.as_uri())
        assert page.locator(".traj").count() == 6
        assert page.locator("#visible-count").inner_text() == "6 shown"
        page.click("button[data-outcome=success]")
        assert page.locator(".traj:not(.hidden)").count() == 3
        page.click("button[data-outcome=masked]")
        assert page.locator(".traj:not(.hidden)").count() == 1
        assert page.locator(".group:not(.hidden)").count() == 1
        page.click("button[data-outcome=all]")
        assert page.locator("img.shot").count() == 1
        assert page.locator("img.shot").evaluate("img => img.naturalWidth") == 1  # the PNG decoded
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "viewer.png"), full_page=False)
        browser.close()
    assert errors == []
    assert (ARTIFACTS / "viewer.png").stat().st_size > 1000


def test_training_run_directory_is_read_step_by_step(tmp_path):
    from turngym.viewer.report import write_report

    env = turngym.make("arith", depth=1, max_turns=2)
    for step in (1, 2):
        d = tmp_path / "trajectories"
        d.mkdir(exist_ok=True)
        (d / f"step-{step:06d}.jsonl").write_text(
            "".join(
                play(env, seed, 0, expert=step == 2).to_json() + "\n" for seed in (step * 10, step * 10 + 1)
            )
        )
    (tmp_path / "trajectories" / "notes.txt").write_text("ignored")
    out = write_report(tmp_path)
    html = out.read_text()
    assert out == tmp_path / "report.html" and html.count('class="traj ') == 4
    assert "return and success by step" in html  # one point per training step


def test_report_shows_where_the_rollout_time_went(run_dir):
    from turngym.rollout.store import load_trajectories

    trajs = load_trajectories(run_dir)
    plain = build_report(trajs, title="t")
    assert 'id="ledger"' not in plain  # trajectories without a ledger: no line, no plot
    for t in trajs:
        t.metrics["time/env_start"] = 1.0
        for turn in t.turns:
            turn.timing = {"generate": 2.0, "generate/decode": 1.5, "env_step": 1.0, "observe": 0.0}
    html = build_report(trajs, title="t")
    turns = sum(t.num_turns for t in trajs)
    total = 6 * 1.0 + turns * 3.0
    # the header's line: shares of the top-level phases; a backend's part of generate is not one
    line = html.split('id="ledger">', 1)[1].split("</span>", 1)[0]
    assert f"generate {100 * 2.0 * turns / total:.0f}%" in line and "env_start" in line
    assert "decode" not in line and "observe" not in line  # no time: left out
    assert "generate/decode 1.500s" in html and "env_step 1.000s" in html  # each turn's tags
    assert "where the rollout time went" in html
