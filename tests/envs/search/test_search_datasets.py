"""Search task sets read through the real ``datasets`` library: Search-R1 parquet, FlashRAG JSONL and
HotpotQA (the release's JSON and the Hugging Face copy's column layout), written here in those formats
as directories, globs, compressed files and ``datasets.Dataset`` objects, and used from ``turngym.make``."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from search_formats import HOTPOT, write_search_r1

import turngym
from turngym.envs.search.loaders import (
    LoadError,
    load_dataset_tasks,
    load_hotpotqa_json,
    load_tasks,
    tasks_from_dataset,
)
from turngym.envs.search.tasks import QATask, write_tasks

datasets = pytest.importorskip("datasets")

CORPUS = [
    {"id": "0", "contents": '"Wilhelm Röntgen"\nWilhelm Röntgen won the first Nobel Prize in Physics.'},
    {"id": "1", "contents": '"Deadpool 2"\nDeadpool 2 was released on May 18, 2018.'},
    {"id": "2", "contents": '"Porvik"\nPorvik is the capital of Nordland.'},
]
QUESTIONS = [
    ("q0", "who won the first nobel prize in physics?", ["Wilhelm Röntgen"]),
    ("q1", "when was deadpool 2 released?", ["May 18, 2018", "2018"]),
    ("q2", "what is the capital of nordland?", ["Porvik"]),
]


def _corpus(tmp_path):
    path = tmp_path / "wiki-18.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    return str(path)


def _run_expert(env, index):
    env.reset(seed=0, options={"task_index": index})
    total, done, info = 0.0, False, {}
    while not done:
        _, reward, terminated, truncated, info = env.step(env.expert_action())
        total += reward
        done = terminated or truncated
    return total, info


def _hf_hotpot_rows(examples):
    """HotpotQA in the Hugging Face copy's layout: context and supporting_facts as columns of lists."""
    return [
        {
            "id": ex["_id"],
            "question": ex["question"],
            "answer": ex["answer"],
            "type": ex["type"],
            "level": ex["level"],
            "supporting_facts": {
                "title": [t for t, _ in ex["supporting_facts"]],
                "sent_id": [i for _, i in ex["supporting_facts"]],
            },
            "context": {"title": [t for t, _ in ex["context"]], "sentences": [s for _, s in ex["context"]]},
        }
        for ex in examples
    ]


def test_search_r1_directory_and_glob_through_make(tmp_path):
    data = tmp_path / "nq_hotpotqa_train"
    data.mkdir()
    rows = [{"id": i, "question": q, "answers": a} for i, q, a in QUESTIONS]
    write_search_r1(data / "train.parquet", rows[:2])
    write_search_r1(data / "test.parquet", rows[2:])
    (data / "dataset_infos.json").write_text("{}")  # what a hub download holds beside the data
    (data / ".cache" / "huggingface").mkdir(parents=True)
    (data / ".cache" / "huggingface" / "x.json").write_text("{}")
    corpus = _corpus(tmp_path)
    env = turngym.make("search-r1", corpus=corpus, tasks=str(data), cache_dir=tmp_path)
    assert sorted(t.id for t in env.tasks) == ["q0", "q1", "q2"]
    assert all(t.kind == "nq" and t.metadata["source"] == "search-r1" for t in env.tasks)
    obs, info = env.reset(seed=0, options={"task_id": "q1"})
    assert "Question: when was deadpool 2 released?" in obs[-1].content
    obs, *_ = env.step("<search> deadpool 2 released </search>")
    assert "(Title: Deadpool 2) Deadpool 2 was released on May 18, 2018." in obs[0].content
    _, reward, terminated, *_ = env.step("<answer> 2018 </answer>")
    assert terminated and reward == 1.0

    only_test = turngym.make(
        "search-r1", corpus=corpus, tasks=str(data / "test*.parquet"), cache_dir=tmp_path
    )
    assert [t.id for t in only_test.tasks] == ["q2"]
    assert _run_expert(only_test, 0)[0] == 1.0
    # the same rows as the plain parquet reader gives
    direct = load_tasks(data / "test.parquet")[0] + load_tasks(data / "train.parquet")[0]  # files sorted
    assert load_dataset_tasks(data, cache_dir=tmp_path)[0] == direct


def test_flashrag_gzip_directory_and_dataset_object(tmp_path):
    tasks = [QATask(i, q, a, kind="nq", metadata={"split": "dev"}) for i, q, a in QUESTIONS]
    folder = tmp_path / "FlashRAG_datasets" / "nq"
    write_tasks(tasks[:2], folder / "dev.jsonl")
    with gzip.open(folder / "test.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"id": "q2", "question": QUESTIONS[2][1], "golden_answers": ["Porvik"]}) + "\n")
    corpus = _corpus(tmp_path)

    gz, _ = load_tasks(folder / "test.jsonl.gz", cache_dir=tmp_path)  # compressed: read by datasets
    assert [(t.id, t.answers) for t in gz] == [("q2", ["Porvik"])]
    env = turngym.make("search-qa", corpus=corpus, tasks=str(folder), cache_dir=tmp_path)
    assert [t.id for t in env.tasks] == ["q0", "q1", "q2"]
    assert env.tasks[0] == tasks[0]  # turngym's own fields survive the JSON -> arrow round trip
    assert [_run_expert(env, i)[0] for i in range(3)] == [1.0, 1.0, 1.0]

    ds = datasets.load_dataset(
        "json", data_files=str(folder / "dev.jsonl"), split="train", cache_dir=str(tmp_path)
    )
    env = turngym.make("search-qa", corpus=corpus, tasks=ds, cache_dir=tmp_path)
    assert [t.id for t in env.tasks] == ["q0", "q1"]
    again = turngym.make("search-qa", corpus=corpus, tasks=ds, cache_dir=tmp_path)
    assert again.tasks is env.tasks  # loaded once per process, keyed by the dataset's fingerprint
    from_list = datasets.Dataset.from_list(
        [{"question": "what is the capital of nordland?", "golden_answers": ["Porvik"]}]
    )
    ds.save_to_disk(str(tmp_path / "saved"))  # a folder save_to_disk wrote
    assert [t.id for t in turngym.make("search-qa", corpus=corpus, tasks=str(tmp_path / "saved")).tasks] == [
        "q0",
        "q1",
    ]
    datasets.DatasetDict({"dev": ds}).save_to_disk(str(tmp_path / "splits"))
    with pytest.raises(LoadError, match=r"splits \['dev'\]: pass one split"):
        load_tasks(tmp_path / "splits")
    assert load_tasks(tmp_path / "splits" / "dev")[0] == list(env.tasks)
    streamed = datasets.load_dataset(
        "json", data_files=str(folder / "dev.jsonl"), split="train", streaming=True
    )  # an IterableDataset: its columns may be known only once read
    assert tasks_from_dataset(streamed)[0] == tasks[:2]
    [task], _ = tasks_from_dataset(from_list)
    assert task.answers == ["Porvik"] and task.id == "dataset-Dataset-1"


def test_hotpotqa_release_json_and_hf_parquet_give_the_same_tasks_and_corpus(tmp_path):
    release = tmp_path / "hotpot_dev_distractor_v1.json"
    release.write_text(json.dumps(HOTPOT))
    want_tasks, want_corpus = load_hotpotqa_json(release)

    got_tasks, got_corpus = load_dataset_tasks(release, cache_dir=tmp_path)  # datasets' JSON reader
    assert got_tasks == want_tasks and list(got_corpus) == list(want_corpus)

    hf = tmp_path / "hotpot_qa" / "distractor"
    hf.mkdir(parents=True)
    rows = _hf_hotpot_rows(HOTPOT)
    pq.write_table(pa.Table.from_pylist(rows[:1]), hf / "validation-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[1:]), hf / "validation-00001-of-00002.parquet")
    env = turngym.make("search-qa", tasks=str(hf / "validation-*.parquet"), cache_dir=tmp_path)
    assert env.tasks == tuple(want_tasks) and list(env.corpus) == list(want_corpus)
    total, info = _run_expert(env, 1)
    assert total == 1.0 and info["reference"]["kind"] == "bridge"
    # the column layout as JSONL too
    (tmp_path / "h.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert load_tasks(tmp_path / "h.jsonl")[0] == want_tasks


def _err(tmp_path, spec, match, **kw):
    with pytest.raises(LoadError, match=match):
        load_tasks(spec, cache_dir=tmp_path, **kw)


def test_bad_task_sets_give_clear_errors(tmp_path):
    good = tmp_path / "good"
    good.mkdir()
    write_search_r1(good / "a.parquet", [{"id": "a", "question": "q?", "answers": ["x"]}])
    (good / "b.parquet").write_bytes(b"PAR1 this is not parquet")
    _err(tmp_path, good, r"b\.parquet: not a readable parquet file: .*(magic|footer|corrupt)")

    cols = tmp_path / "cols"
    cols.mkdir()
    pq.write_table(pa.table({"question": ["q?"], "label": ["x"]}), cols / "x.parquet")
    _err(tmp_path, cols, r"x\.parquet: columns \['label', 'question'\] match no task format \(hotpotqa needs")
    _err(
        tmp_path,
        cols,
        r"x\.parquet: the flashrag format needs columns question and golden_answers",
        format="flashrag",
    )

    mixed = tmp_path / "mixed"
    write_tasks([QATask("t", "q?", ["a"])], mixed / "a.jsonl")
    (mixed / "b.jsonl").write_text(json.dumps({"id": "h", "question": "q", "context": []}) + "\n")
    _err(
        tmp_path, mixed, r"b\.jsonl: the flashrag format needs .*has columns \['context', 'id', 'question'\]"
    )

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "dev.jsonl").write_text('{"id": "1", "question": "q", "golden_answers": ["a"]}\n{broken\n')
    _err(tmp_path, broken, r"dev\.jsonl: not a readable json file: .*(JSON|parse)")

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("hello")
    _err(tmp_path, empty, "no parquet or JSON\\(L\\) files in this directory")
    _err(tmp_path, str(tmp_path / "none" / "*.parquet"), r"no task files match .*none/\*\.parquet")
    _err(tmp_path, [str(tmp_path / "missing.jsonl")], "task file not found")
    _err(tmp_path, [str(empty / "notes.txt")], r"cannot read .*notes\.txt.*task files are")

    badrow = tmp_path / "badrow.parquet"
    pq.write_table(
        pa.table({"id": ["a", "b"], "question": ["q?", ""], "golden_answers": [["x"], ["y"]]}), badrow
    )
    _err(tmp_path, [str(badrow)], r"badrow\.parquet: row 1: .*non-empty string")
    hot = tmp_path / "hot.parquet"
    pq.write_table(
        pa.Table.from_pylist([_hf_hotpot_rows(HOTPOT)[0] | {"context": {"title": ["A"], "sentences": []}}]),
        hot,
    )
    _err(tmp_path, [str(hot)], r"hot\.parquet: row 0: 'context' needs equally long 'title' and 'sentences'")

    splits = datasets.DatasetDict(
        {"test": datasets.Dataset.from_list([{"question": "q", "golden_answers": ["a"]}])}
    )
    with pytest.raises(LoadError, match=r"splits \['test'\]: pass one split"):
        turngym.make("search-qa", tasks=splits, corpus=_corpus(tmp_path), cache_dir=tmp_path)
    with pytest.raises(LoadError, match="got int"):
        load_tasks(7)


_answers = st.lists(
    st.text("abcdefghij XYZ", min_size=1, max_size=8).filter(str.strip), min_size=1, max_size=3
)
_record = st.builds(
    lambda i, q, a, kind, hops: {
        "id": f"r{i}",
        "question": q,
        "golden_answers": a,
        "metadata": {"kind": kind, "hops": hops},
    },
    st.integers(0, 10_000),
    st.text("abcdefghij ?", min_size=1, max_size=20).filter(str.strip),
    _answers,
    st.sampled_from(["", "bridge", "nq"]),
    st.integers(0, 4),
)


@settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=st.lists(_record, min_size=1, max_size=6, unique_by=lambda r: r["id"]))
def test_one_row_mapping_whatever_the_reader(tmp_path_factory, records):
    """The same FlashRAG rows give the same tasks from JSONL, from parquet, and through ``datasets``."""
    tmp = tmp_path_factory.mktemp("rows")
    jsonl = tmp / "t.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in records))
    parquet = tmp / "t.parquet"
    pq.write_table(pa.Table.from_pylist(records), parquet)
    want = [QATask.from_record(r) for r in records]
    assert load_tasks(jsonl)[0] == want
    assert load_tasks(parquet)[0] == want
    assert load_dataset_tasks([jsonl, parquet], cache_dir=tmp)[0] == want + want
