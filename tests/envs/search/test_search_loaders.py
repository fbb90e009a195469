"""Loaders for Search-R1 parquet, FlashRAG JSONL and HotpotQA JSON, on files written here in those formats."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from search_formats import HOTPOT, SEARCH_R1_PREFIX, write_search_r1

from turngym.envs.search.loaders import (
    LoadError,
    detect_format,
    join_sentences,
    load_flashrag_jsonl,
    load_hotpotqa_json,
    load_search_r1_parquet,
    load_tasks,
)
from turngym.envs.search.tasks import QATask, write_tasks


def test_search_r1_parquet(tmp_path):
    path = tmp_path / "train.parquet"
    write_search_r1(
        path,
        [
            {
                "id": "train_0",
                "question": "who got the first nobel prize in physics?",
                "answers": ["Wilhelm Conrad Röntgen"],
            },
            {
                "id": "train_1",
                "question": "when is the next deadpool movie being released?",
                "answers": ["May 18, 2018", "2018"],
            },
        ],
    )
    tasks = load_search_r1_parquet(path)
    assert [t.id for t in tasks] == ["train_0", "train_1"]
    assert tasks[1].answers == ["May 18, 2018", "2018"] and tasks[0].kind == "nq"
    assert tasks[0].question == "who got the first nobel prize in physics?"
    assert load_tasks(path)[0][0].to_record() == tasks[0].to_record()


def test_search_r1_parquet_with_only_prompt_and_reward_model(tmp_path):
    """Files that dropped the raw columns still load: question from the prompt, answers from reward_model."""
    path = tmp_path / "test.parquet"
    table = pa.table(
        {
            "data_source": ["hotpotqa"],
            "prompt": [[{"role": "user", "content": SEARCH_R1_PREFIX + "Which city is bigger?\n"}]],
            "reward_model": [{"style": "rule", "ground_truth": {"target": ["Porvik"]}}],
            "extra_info": [{"split": "test", "index": 7}],
        }
    )
    pq.write_table(table, path)
    [task] = load_search_r1_parquet(path)
    assert (task.id, task.question, task.answers) == ("hotpotqa-7", "Which city is bigger?", ["Porvik"])


def test_flashrag_jsonl_round_trip_and_errors(tmp_path):
    path = tmp_path / "dev.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "test_0",
                "question": "who wrote x?",
                "golden_answers": ["A. Author"],
                "metadata": {"src": "nq"},
            }
        )
        + "\n\n"
        + json.dumps({"id": "test_1", "question": "no label", "golden_answers": []})
        + "\n"
    )
    [task] = load_flashrag_jsonl(path)  # the unlabelled row is skipped
    assert task.answers == ["A. Author"] and task.metadata == {"src": "nq"}
    mine = QATask(
        "t", "q?", ["a"], supporting_ids=["1", "2"], gold_trace=["x a", "y b"], kind="bridge", hops=2
    )
    out = write_tasks([mine], tmp_path / "mine.jsonl")
    assert load_flashrag_jsonl(out)[0] == mine
    path.write_text('{"id": 1, "question": "q", "golden_answers": ["a"]}\n{broken\n')
    with pytest.raises(LoadError, match="dev.jsonl:2"):
        load_flashrag_jsonl(path)
    path.write_text('{"id": 1, "question": "", "golden_answers": ["a"]}\n')
    with pytest.raises(LoadError, match="non-empty string"):
        load_flashrag_jsonl(path)


def test_hotpotqa_json_builds_tasks_and_corpus(tmp_path):
    path = tmp_path / "hotpot_dev_distractor_v1.json"
    path.write_text(json.dumps(HOTPOT))
    assert detect_format(path) == "hotpotqa"
    tasks, corpus = load_hotpotqa_json(path)
    assert len(corpus) == 5  # "Ed Wood" appears in both examples but is one passage
    bridge = tasks[1]
    assert bridge.kind == "bridge" and bridge.answers == ["Chief of Protocol"] and bridge.hops == 2
    assert [corpus.get(pid).title for pid in bridge.supporting_ids] == [
        "Kiss and Tell (1945 film)",
        "Shirley Temple",
    ]
    assert bridge.gold_trace == ["Kiss and Tell (1945 film)", "Shirley Temple"]
    assert corpus.get(bridge.supporting_ids[1]).contents.endswith("Chief of Protocol of the United States.")


def test_hotpotqa_errors(tmp_path):
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(LoadError, match="JSON list"):
        load_hotpotqa_json(path)
    path.write_text(json.dumps([{"question": "q", "answer": "a", "context": [["only a title"]]}]))
    with pytest.raises(LoadError, match=r"\[title, sentences\]"):
        load_hotpotqa_json(path)


def test_format_detection_and_missing_files(tmp_path):
    """The format comes from the rows' columns, whatever the file type."""
    write_search_r1(tmp_path / "x.parquet", [{"id": "a", "question": "q?", "answers": ["a"]}])
    assert detect_format(tmp_path / "x.parquet") == "search-r1"
    write_tasks([QATask("t", "q?", ["a"])], tmp_path / "x.jsonl")
    assert detect_format(tmp_path / "x.jsonl") == "flashrag"
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(ex) + "\n" for ex in HOTPOT))
    assert detect_format(tmp_path / "h.jsonl") == "hotpotqa"
    (tmp_path / "odd.jsonl").write_text('{"query": "q?", "label": "a"}\n')
    with pytest.raises(LoadError, match=r"odd.jsonl: columns \['label', 'query'\] match no task format"):
        detect_format(tmp_path / "odd.jsonl")
    with pytest.raises(LoadError, match="suffix"):
        detect_format(tmp_path / "x.csv")
    with pytest.raises(LoadError, match="not found"):
        load_tasks(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    with pytest.raises(LoadError, match="parquet"):
        load_tasks(bad)


def test_hotpotqa_sentences_are_joined_without_gluing(tmp_path):
    record = {
        "_id": "x1",
        "question": "What returns?",
        "answer": "It",
        "supporting_facts": [["Marrow", 0]],
        "context": [["Marrow", ["The film is Marrow.", "It returns in 2020.", " It ends."]]],
    }
    path = tmp_path / "h.json"
    path.write_text(json.dumps([record]))
    _, corpus = load_hotpotqa_json(path)
    (passage,) = list(corpus)
    assert passage.contents == "The film is Marrow. It returns in 2020. It ends."
    path.write_text(json.dumps([record | {"context": [["Marrow", "not a list"]]}]))
    with pytest.raises(LoadError, match="sentences of 'Marrow' must be a list of strings"):
        load_hotpotqa_json(path)


def test_join_sentences_follows_hotpotqa_spacing():
    # HotpotQA's sentences after the first mostly carry their own leading space; some do not
    assert join_sentences(["Ed Wood is a film.", " It stars Johnny Depp."]) == (
        "Ed Wood is a film. It stars Johnny Depp."
    )
    assert join_sentences(["It is Marrow.", "It returns.", " Then ends.", ""]) == (
        "It is Marrow. It returns. Then ends."
    )
    assert join_sentences(["Line one.\n", "Line two."]) == "Line one.\nLine two."
    assert join_sentences([" Lead.", "Next."]) == "Lead. Next."
    assert join_sentences([]) == ""


_body = st.text("abcXYZ.,'()é0", min_size=1, max_size=12).filter(lambda s: s.strip() == s)
_space = st.text(" \n\t", max_size=3)


@settings(max_examples=200)
@given(first=_body, rest=st.lists(_body, max_size=6))
def test_join_sentences_equals_plain_concatenation_on_the_release_spacing(first, rest):
    """HotpotQA's release: the first sentence bare, each later one with its leading space."""
    sentences = [first] + [" " + s for s in rest]
    assert join_sentences(sentences) == "".join(sentences)


@settings(max_examples=300)
@given(st.lists(st.tuples(_space, st.text("abc. \n", max_size=10), _space), max_size=8))
def test_join_sentences_never_glues_nor_doubles_spaces(parts):
    sentences = [lead + body + trail for lead, body, trail in parts]
    bodies = [s.strip() for s in sentences if s.strip()]
    out = join_sentences(sentences)
    # every sentence, in order, with exactly one space or newline where two meet
    assert out.replace("\n", " ") == " ".join(bodies).replace("\n", " ")
    assert out == out.strip()
    if not any("  " in b for b in bodies):
        assert "  " not in out
    assert join_sentences([out]) == out
