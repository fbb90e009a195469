"""The ``turngym search`` commands, run through typer's test runner."""

from __future__ import annotations

from typer.testing import CliRunner

from turngym.envs.search.commands import app
from turngym.envs.search.corpus import Corpus
from turngym.envs.search.loaders import load_flashrag_jsonl

runner = CliRunner()


def test_generate_index_query(tmp_path):
    res = runner.invoke(
        app, ["generate", str(tmp_path / "w"), "--passages", "300", "--questions", "20", "--seed", "4"]
    )
    assert res.exit_code == 0, res.output
    corpus = Corpus.from_jsonl(tmp_path / "w" / "corpus.jsonl")
    tasks = load_flashrag_jsonl(tmp_path / "w" / "tasks.jsonl")
    assert len(corpus) == 300 and len(tasks) == 20 and all(t.gold_trace for t in tasks)

    res = runner.invoke(
        app, ["index", str(tmp_path / "w" / "corpus.jsonl"), "--cache-dir", str(tmp_path / "c")]
    )
    assert res.exit_code == 0 and "built in" in res.output
    res = runner.invoke(
        app, ["index", str(tmp_path / "w" / "corpus.jsonl"), "--cache-dir", str(tmp_path / "c")]
    )
    assert res.exit_code == 0 and "loaded from cache" in res.output

    query = tasks[0].gold_trace[0]
    res = runner.invoke(app, ["query", query, "--corpus", str(tmp_path / "w" / "corpus.jsonl"), "--k", "2"])
    assert res.exit_code == 0 and res.output.startswith("Doc 1 (Title: ") and "Doc 2 (Title: " in res.output


def test_query_against_a_dead_server_fails_cleanly():
    res = runner.invoke(app, ["query", "x", "--url", "http://127.0.0.1:9"])
    assert res.exit_code != 0 and "unreachable" in res.output
