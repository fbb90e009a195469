"""The search-qa env: conformance, expert and floors, rewards, tag protocol, bad input, options."""

from __future__ import annotations

import json

import pytest

import turngym
from turngym.core.types import Message, ToolCall
from turngym.envs.search.corpus import Corpus
from turngym.envs.search.env import SEARCH_R1_PROMPT, SearchQAEnv
from turngym.envs.search.tasks import QATask, write_tasks
from turngym.testing import check_env

SMALL = {"n_passages": 1500, "n_tasks": 150}  # a small generated world, cached per test session


def call(name, **arguments):
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def run_expert(env, seed):
    obs, info = env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        obs, reward, terminated, truncated, info = env.step(env.expert_action())
        total += reward
        done = terminated or truncated
    return total, info


@pytest.fixture
def env():
    e = turngym.make("search-qa", **SMALL)
    yield e
    e.close()


@pytest.mark.parametrize("env_id", ["search-qa", "search-r1"])
def test_conformance(env_id):
    check_env(env_id, **SMALL).raise_for_failures()


def test_registered_ids_and_defaults(env):
    assert isinstance(env, SearchQAEnv) and env.max_turns == 6
    assert [t.name for t in env.tools] == ["search", "answer"]
    assert env.toolbox.is_terminal("answer") and not env.toolbox.is_terminal("search")
    assert turngym.spec("search-r1").kwargs["parser"] == "tags"
    params = env.tools[0].parameters
    assert params["properties"]["k"]["default"] == 3 and params["required"] == ["query"]


@pytest.mark.parametrize("parser", ["hermes", "tags", "openai"])
def test_expert_solves_generated_tasks(parser):
    env = turngym.make("search-qa", parser=parser, **SMALL)
    rewards = [run_expert(env, seed)[0] for seed in range(40)]
    assert sum(r == 1.0 for r in rewards) / len(rewards) >= 0.95
    env.close()


def test_expert_retrieves_all_supporting_passages_before_answering(env):
    for seed in range(15):
        obs, info = env.reset(seed=seed)
        ref = info["reference"]
        while True:
            action = env.expert_action()
            if '"answer"' in action:
                assert set(ref["supporting_ids"]) <= env._retrieved
                break
            env.step(action)


def test_question_alone_is_a_weak_floor(env):
    """Search the question once and answer the top passage's title: scores far below the expert."""
    em = 0.0
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        obs, *_ = env.step(call("search", query=info["reference"]["question"], k=1))
        title = obs[0].content.split("(Title: ", 1)[-1].split(")", 1)[0]
        _, reward, *_ = env.step(call("answer", text=title))
        em += reward
    assert em / 40 < 0.2


def test_reset_observation_info_and_reference(env):
    obs, info = env.reset(seed=5)
    assert [m.role for m in obs] == ["system", "user"]
    assert obs[1].content.startswith("Question: ") and "search" in obs[0].content
    ref = info["reference"]
    assert ref["answer"] == ref["answers"][0] and ref["gold_trace"] and ref["supporting_ids"]
    assert ref["answer"].lower() not in obs[1].content.lower()
    assert not any(pid in m.content for m in obs for pid in ref["gold_trace"])
    assert info["state_key"] == f"{info['task_id']}|" and info["hops"] == ref["hops"]
    again, info2 = env.reset(seed=5)
    assert again == obs and info2["task_id"] == info["task_id"]


def test_search_result_format_and_state_key(env):
    obs, info = env.reset(seed=2)
    query = info["reference"]["gold_trace"][0]
    obs, reward, terminated, truncated, info = env.step(call("search", query=query, k=2))
    lines = obs[0].content.split("\n")
    assert len(lines) == 2 and lines[0].startswith("Doc 1 (Title: ") and lines[1].startswith("Doc 2 (Title: ")
    assert obs[0].role == "tool" and reward == 0.0 and not (terminated or truncated)
    assert info["reward_components"] == {} and not info["invalid_action"]
    ids = sorted(d.id for d in env.retriever.retrieve([query], 2)[0])
    assert info["state_key"] == f"{info['task_id']}|{','.join(ids)}"
    _, _, _, _, info2 = env.step(call("search", query=query, k=2))  # same docs again: same state
    assert info2["state_key"] == info["state_key"]


def test_answer_rewards_em_and_f1(env):
    obs, info = env.reset(seed=3)
    gold = info["reference"]["answers"][0]
    _, reward, terminated, _, info = env.step(call("answer", text=f"The {gold.upper()}!"))
    assert terminated and reward == 1.0
    assert info["reward_components"] == {"em": 1.0, "f1": 1.0, "format": 0.0}
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step(call("answer", text=gold))

    f1_env = turngym.make("search-qa", reward="f1", **SMALL)
    obs, info = f1_env.reset(seed=3)
    _, reward, *_, info = f1_env.step(call("answer", text=f"{gold} extra words"))
    comps = info["reward_components"]
    assert comps["em"] == 0.0 and 0 < comps["f1"] < 1 and reward == comps["f1"]


def test_no_answer_gets_the_format_penalty(env):
    env.reset(seed=0)
    for _ in range(6):
        _, reward, terminated, truncated, info = env.step(call("search", query="city"))
    assert truncated and not terminated
    assert info["reward_components"] == {"em": 0.0, "f1": 0.0, "format": -0.1} and reward == -0.1


@pytest.mark.parametrize(
    "action, message",
    [
        (call("search", query="   "), "the query is empty"),
        (call("search", query="x" * 600), "the limit is 500"),
        (call("search", query="porvik", k=0), "k must be between 1 and 10"),
        (call("search", query="porvik", k=10_000), "k must be between 1 and 10"),
        (call("search", query=42), "argument 'query'"),
        (call("search", query=["a", "b"]), "argument 'query'"),
        (call("search", query="porvik", k="many"), "argument 'k'"),
        (call("search"), "missing required argument 'query'"),
        (call("answer", text=None), "argument 'text'"),
        (call("lookup", query="x"), "unknown tool 'lookup'"),
    ],
)
def test_bad_calls_are_error_observations(env, action, message):
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["invalid_action"] and message in info["error"] and message in obs[0].content
    assert not terminated and reward == 0.0
    obs, reward, terminated, *_ = env.step(call("search", query="city"))  # the episode goes on
    assert not terminated and obs[0].content.startswith("Doc 1")


def test_answering_twice_in_one_turn_keeps_the_first(env):
    obs, info = env.reset(seed=4)
    gold = info["reference"]["answer"]
    _, reward, terminated, _, info = env.step(call("answer", text=gold) + call("answer", text="wrong"))
    assert terminated and reward == 1.0 and env.last_answer == gold


def test_tag_protocol_matches_search_r1():
    env = turngym.make("search-r1", **SMALL)
    obs, info = env.reset(seed=1)
    assert [m.role for m in obs] == ["user"]
    assert obs[0].content == SEARCH_R1_PROMPT.format(question=info["reference"]["question"])
    query = info["reference"]["gold_trace"][0]
    obs, *_ = env.step(f"<think>I need facts.</think>\n<search> {query} </search>")
    assert obs[0].role == "user" and obs[0].content.startswith("<information>Doc 1 (Title: ")
    assert obs[0].content.endswith("</information>") and obs[0].content.count("\nDoc ") == 2
    obs, _, _, _, info = env.step("<think>hmm</think>")
    assert info["invalid_action"] and "<search>" in obs[0].content
    _, reward, terminated, *_ = env.step(f"<answer> {info['reference']['answer']} </answer>")
    assert terminated and reward == 1.0


def test_structured_openai_calls():
    env = turngym.make("search-qa", parser="openai", **SMALL)
    obs, info = env.reset(seed=0)
    msg = Message(
        role="assistant", tool_calls=[ToolCall(id="c1", name="search", arguments={"query": "city"})]
    )
    obs, *_ = env.step(msg)
    assert obs[0].tool_call_id == "c1" and obs[0].content.startswith("Doc 1")


def test_simulated_noise_hides_supporting_passages():
    env = turngym.make("search-qa", noise_prob=1.0, **SMALL)
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        ref = info["reference"]
        for query in ref["gold_trace"]:
            obs, *_ = env.step(call("search", query=query))
            titles = [line.split(")", 1)[1] for line in obs[0].content.split("\n")]
            assert len(titles) == len(set(titles)) == 3  # three distinct passages
        assert not set(ref["supporting_ids"]) & env._retrieved
    a = turngym.make("search-qa", noise_prob=0.5, **SMALL)
    b = turngym.make("search-qa", noise_prob=0.5, **SMALL)
    for e in (a, b):
        e.reset(seed=7)
    q = call("search", query="mayor city")
    assert [a.step(q)[0][0].content for _ in range(4)] == [b.step(q)[0][0].content for _ in range(4)]
    env.reset(seed=0, options={"noise_prob": 0.0})  # curriculum: per-episode override
    ref = env.task.reference
    env.step(call("search", query=ref["gold_trace"][0]))
    assert ref["supporting_ids"][0] in env._retrieved


def test_options_select_tasks_and_filters_split(env):
    task = env.tasks[7]
    _, info = env.reset(options={"task_id": task.id})
    assert info["task_id"] == task.id
    _, info = env.reset(options={"task_index": 7})
    assert info["task_id"] == task.id
    with pytest.raises(ValueError, match="unknown task_id"):
        env.reset(options={"task_id": "nope"})
    train = turngym.make("search-qa", split="train", **SMALL)
    test = turngym.make("search-qa", split="test", **SMALL)
    assert not {t.id for t in train.tasks} & {t.id for t in test.tasks}
    assert len(train.tasks) + len(test.tasks) == SMALL["n_tasks"]
    deep = turngym.make("search-qa", hops=[4], kinds=["bridge"], **SMALL)
    assert deep.tasks and all(t.hops == 4 and t.kind == "bridge" for t in deep.tasks)
    with pytest.raises(ValueError, match="no tasks left"):
        turngym.make("search-qa", hops=[9], **SMALL)


def test_user_corpus_and_task_files(tmp_path):
    corpus = Corpus.from_records(
        [
            {"id": "p1", "title": "Porvik", "contents": "Porvik is the capital of Veloria."},
            {"id": "p2", "title": "Veloria", "contents": "Veloria uses the krona."},
        ]
    )
    corpus_path = corpus.to_jsonl(tmp_path / "corpus.jsonl")
    task = QATask(
        "q1", "Which country has Porvik as its capital?", ["Veloria"], ["p1"], ["Porvik capital"], "bridge", 1
    )
    tasks_path = write_tasks([task], tmp_path / "tasks.jsonl")
    env = SearchQAEnv(corpus=corpus_path, tasks=tasks_path, cache_dir=tmp_path / "cache")
    total, info = run_expert(env, 0)
    assert total == 1.0 and info["task_id"] == "q1"
    with pytest.raises(ValueError, match="need a corpus"):
        SearchQAEnv(tasks=tasks_path)
    with pytest.raises(ValueError, match="without tasks"):
        SearchQAEnv(corpus=corpus_path)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reward": "bleu"}, "reward must be"),
        ({"noise_prob": 2.0}, "noise_prob"),
        ({"split": "dev"}, "split"),
    ],
)
def test_bad_configuration(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SearchQAEnv(**SMALL, **kwargs)


def test_default_world_is_cached_on_disk(search_cache):
    turngym.make("search-qa", **SMALL)
    worlds = list((search_cache / "search" / "worlds").iterdir())
    assert any((w / "corpus.jsonl").is_file() and (w / "tasks.jsonl").is_file() for w in worlds)
    assert any((d / "done").is_file() for d in (search_cache / "search" / "bm25").iterdir())


def test_easy_mix_has_single_hop_questions_the_expert_solves():
    env = turngym.make("search-qa", mix="easy", **SMALL)
    hops = {t.hops for t in env.tasks}
    assert 1 in hops and max(hops) <= 3
    assert all(run_expert(env, seed)[0] == 1.0 for seed in range(10))
    with pytest.raises(ValueError, match="unknown question mix"):
        turngym.make("search-qa", mix="nightmare", **SMALL)


def test_hotpotqa_file_brings_its_own_corpus(tmp_path):
    from search_formats import HOTPOT

    path = tmp_path / "hotpot.json"
    path.write_text(json.dumps(HOTPOT))
    env = turngym.make("search-qa", tasks=str(path), cache_dir=tmp_path)
    total, info = run_expert(env, 0)
    assert total == 1.0 and info["reference"]["kind"] in ("bridge", "comparison")
    assert set(info["reference"]["supporting_ids"]) <= env._retrieved


def test_search_r1_parquet_with_wiki18_corpus(tmp_path):
    from search_formats import write_search_r1

    corpus = tmp_path / "wiki-18.jsonl"
    corpus.write_text(
        json.dumps(
            {
                "id": "0",
                "contents": '"Wilhelm Röntgen"\nWilhelm Röntgen won the first Nobel Prize in Physics.',
            }
        )
        + "\n"
        + json.dumps({"id": "1", "contents": '"Deadpool 2"\nDeadpool 2 was released on May 18, 2018.'})
        + "\n"
    )
    tasks = tmp_path / "test.parquet"
    write_search_r1(
        tasks,
        [
            {
                "id": "test_0",
                "question": "who won the first nobel prize in physics?",
                "answers": ["Wilhelm Röntgen"],
            }
        ],
    )
    env = turngym.make("search-r1", corpus=str(corpus), tasks=str(tasks), cache_dir=tmp_path)
    obs, info = env.reset(seed=0)
    obs, *_ = env.step("<search> first nobel prize physics </search>")
    assert obs[0].content.startswith("<information>Doc 1 (Title: Wilhelm Röntgen) Wilhelm Röntgen won")
    _, reward, terminated, *_ = env.step("<answer> wilhelm röntgen </answer>")
    assert terminated and reward == 1.0


def test_huge_passages_are_truncated_not_lost(tmp_path):
    corpus = Corpus.from_records([{"id": "big", "title": "Big", "contents": "porvik " * 50_000}])
    task = QATask("q", "What is big?", ["porvik"])
    env = SearchQAEnv(corpus=corpus, tasks=[task], cache_dir=tmp_path)
    env.reset(seed=0)
    obs, _, _, _, info = env.step(call("search", query="porvik"))
    assert len(obs[0].content) <= 16_000 and "characters truncated" in obs[0].content
    assert info["tool_results"][0].truncated and info["state_key"].endswith("|big")


def test_noise_in_a_tiny_corpus_draws_distinct_random_passages(tmp_path):
    texts = [f"porvik fact {i}" if i < 2 else f"other {i}" for i in range(8)]  # only two passages match
    corpus = Corpus.from_records(
        [{"id": str(i), "title": f"T{i}", "contents": t} for i, t in enumerate(texts)]
    )
    task = QATask("q", "What?", ["x"], supporting_ids=["0"], gold_trace=["porvik fact"])
    env = SearchQAEnv(corpus=corpus, tasks=[task], noise_prob=1.0, cache_dir=tmp_path)
    for seed in range(5):
        env.reset(seed=seed)
        obs, *_ = env.step(call("search", query="porvik fact", k=3))
        ids = [line.split("Title: T", 1)[1].split(")", 1)[0] for line in obs[0].content.split("\n")]
        assert len(set(ids)) == len(ids) == 3 and not {"0", "1"} & set(ids)  # neither gold nor the real hit
