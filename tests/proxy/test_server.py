"""The proxy over loopback with the real ``openai`` client: a tiny HF model (CPU) and a scripted policy."""

from __future__ import annotations

import json
import time

import httpx as _httpx
import openai
import pytest

from turngym.proxy import make_proxy, serve_proxy
from turngym.proxy.scripted import ScriptedBackend, arith_policy

httpx = _httpx.Client(timeout=120)
TOKEN = "proxy-test-token-0123456789"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculate",
            "description": "one operation",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "op": {"type": "string"}, "b": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "answer",
            "parameters": {"type": "object", "properties": {"value": {"type": "integer"}}},
        },
    },
]
TASK = [{"role": "system", "content": "You compute."}, {"role": "user", "content": "Evaluate: ((2 + 3) * 4)"}]


class Recording:
    """The tiny backend, plus a record of every prompt it was given and what it sampled."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    async def generate(self, prompt_ids, sampling, *, route=None, adapter=None):
        gen = await self.backend.generate(prompt_ids, sampling, route=route, adapter=adapter)
        self.calls.append((list(prompt_ids), list(gen.token_ids), list(gen.logprobs)))
        return gen

    def release(self, route):
        self.backend.release(route)


@pytest.fixture(scope="module")
def tiny(hf_backend, tokenizer, tmp_path_factory):
    rec = Recording(hf_backend)
    out = tmp_path_factory.mktemp("tiny-run")
    proxy = make_proxy(
        backend=rec,
        tokenizer=tokenizer,
        name="tiny",
        max_context=512,
        max_tokens=16,
        out=out,
        reward_timeout_s=0.5,
    )
    with serve_proxy(proxy, token=TOKEN) as running:
        running.recording = rec
        running.out = out
        yield running


@pytest.fixture(scope="module")
def scripted(tokenizer):
    proxy = make_proxy(
        backend=ScriptedBackend(tokenizer, arith_policy),
        tokenizer=tokenizer,
        name="arith-expert",
        max_context=2048,
    )
    with serve_proxy(proxy, token=TOKEN) as running:
        yield running


def client(running, episode=None, **kw):
    return openai.OpenAI(base_url=running.base_url(episode), api_key=TOKEN, max_retries=0, **kw)


def test_the_openai_tool_loop_records_one_token_exact_sequence(scripted):
    c = client(scripted, "loop-1")
    messages = list(TASK)
    replies = []
    for _ in range(6):
        r = c.chat.completions.create(model="arith-expert", messages=messages, tools=TOOLS)
        msg = r.choices[0].message
        replies.append(r)
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            break
        call = msg.tool_calls[0]
        assert r.choices[0].finish_reason == "tool_calls"
        args = json.loads(call.function.arguments)
        if call.function.name == "answer":
            assert args == {"value": 20}
            break
        result = {"+": args["a"] + args["b"], "*": args["a"] * args["b"]}[args["op"]]
        messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    assert [r.choices[0].message.tool_calls[0].function.name for r in replies] == [
        "calculate",
        "calculate",
        "answer",
    ]
    scripted.post_reward("loop-1", 1.0, {"correct": 1.0})
    traj = scripted.proxy.store.finished["loop-1"]
    assert traj.metrics["segments"] == 1 and traj.metrics["drift"] == 0 and len(traj.turns) == 3
    assert traj.turns[-1].reward == 1.0 and traj.turns[-1].reward_components == {"correct": 1.0}
    assert traj.total_reward == 1.0
    # each call's reply is the sampled ids at its span; the loss mask covers exactly those ids
    fmt = scripted.proxy.model.text_format
    for turn, r in zip(traj.turns, replies, strict=True):
        s, e = turn.gen_span
        assert traj.loss_mask[s:e] == [1] * (e - s)
        text = fmt.decode(traj.token_ids[s:e])
        call = json.loads(text.split("<tool_call>")[1].split("</tool_call>")[0])
        assert json.loads(r.choices[0].message.tool_calls[0].function.arguments) == call["arguments"]
        assert r.usage.prompt_tokens == s
    assert sum(traj.loss_mask) == sum(e - s for s, e in (t.gen_span for t in traj.turns))
    assert [t.observation[0].content for t in traj.turns[:-1]] == ["5", "20"]


def test_prompts_extend_the_previous_prompt_and_sample_and_logprobs_are_the_backends(tiny):
    c = client(tiny, "exact-1")
    n0 = len(tiny.recording.calls)
    messages = list(TASK)
    r1 = c.chat.completions.create(model="tiny", messages=messages, logprobs=True, temperature=0)
    messages += [r1.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    r2 = c.chat.completions.create(model="tiny", messages=messages, logprobs=True, temperature=0)
    (p1, s1, l1), (p2, s2, l2) = tiny.recording.calls[n0:]
    assert p2[: len(p1) + len(s1)] == p1 + s1  # the second prompt continues the first token for token
    assert [t.logprob for t in r1.choices[0].logprobs.content] == pytest.approx(l1)
    assert [t.logprob for t in r2.choices[0].logprobs.content] == pytest.approx(l2)
    # ended by the harness (the route: the store lives on the server's loop), no reward and no
    # reward_fn: masked once the 0.5 s reward deadline passes (the server sweeps every second)
    end = httpx.post(tiny.url + "/v1/episodes/exact-1/end", headers={"Authorization": f"Bearer {TOKEN}"})
    assert end.status_code == 200 and end.json()["status"] == "ended"
    deadline = time.monotonic() + 30
    while "exact-1" not in tiny.proxy.store.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    traj = tiny.proxy.store.finished["exact-1"]
    assert traj.masked and traj.mask_reason.startswith("no_reward")
    assert traj.token_ids == p2 + s2 and traj.logprobs[len(p2) :] == pytest.approx(l2)
    assert traj.loss_mask == [0] * len(p1) + [1] * len(s1) + [0] * (len(p2) - len(p1) - len(s1)) + [1] * len(
        s2
    )
    lines = (tiny.out / "trajectories.jsonl").read_text().splitlines()
    assert any(json.loads(line)["metadata"]["episode"] == "exact-1" for line in lines)
    from turngym.viewer.report import write_report  # turngym view renders the episodes

    html = write_report(tiny.out, tiny.out / "report.html").read_text()
    assert "exact-1" in html or r1.choices[0].message.content[:20] in html


def test_streaming_gives_the_same_reply_as_a_plain_call(tiny):
    c = client(tiny)
    plain = c.chat.completions.create(model="tiny", messages=TASK, temperature=0, seed=3, max_tokens=8)
    chunks = list(
        c.chat.completions.create(
            model="tiny",
            messages=TASK,
            temperature=0,
            seed=3,
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain.choices[0].message.content
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == plain.choices[0].finish_reason
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens


def test_n_seed_stop_and_max_tokens(tiny):
    c = client(tiny, "sampling")
    a = c.chat.completions.create(model="tiny", messages=TASK, n=3, seed=11, max_completion_tokens=6)
    b = c.chat.completions.create(model="tiny", messages=TASK, n=3, seed=11, max_completion_tokens=6)
    assert len(a.choices) == 3 and [x.message.content for x in a.choices] == [
        x.message.content for x in b.choices
    ]
    assert all(a.usage.completion_tokens <= 18 for _ in a.choices)
    full = (
        c.chat.completions.create(model="tiny", messages=TASK, temperature=0, max_tokens=12)
        .choices[0]
        .message.content
    )
    stop = full[3:6]
    cut = c.chat.completions.create(model="tiny", messages=TASK, temperature=0, max_tokens=12, stop=[stop])
    assert cut.choices[0].message.content == full[: full.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_completions_endpoint(tiny):
    c = client(tiny, "text-1")
    r = c.completions.create(model="tiny", prompt="Evaluate: 2 + 3", max_tokens=5, logprobs=1, temperature=0)
    assert len(r.choices[0].logprobs.token_logprobs) == r.usage.completion_tokens
    r2 = c.completions.create(
        model="tiny", prompt="Evaluate: 2 + 3" + r.choices[0].text + " ok", max_tokens=5
    )
    ep = tiny.proxy.store.live["text-1"]
    assert ep.segments == 1 and len(ep.calls) == 2 and r2.choices[0].text is not None


@pytest.mark.parametrize(
    "body,param",
    [
        ({"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"model": "tiny", "messages": TASK, "temperature": "hot"}, "temperature"),
        ({"model": "tiny", "messages": TASK, "temperature": 3}, "temperature"),
        ({"model": "tiny", "messages": TASK, "n": 0}, "n"),
        ({"model": "tiny", "messages": TASK, "max_tokens": 0}, "max_tokens"),
        ({"messages": TASK}, "model"),
        ({"model": "tiny", "messages": []}, "messages"),
        ({"model": "tiny", "messages": TASK, "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"model": "tiny", "messages": TASK, "response_format": {"type": "json_object"}}, "response_format"),
        (
            {
                "model": "tiny",
                "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            },
            "messages[0].content[0].type",
        ),
        (
            {
                "model": "tiny",
                "messages": [
                    *TASK,
                    {
                        "role": "assistant",
                        "tool_calls": [
                            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{oops"}}
                        ],
                    },
                ],
            },
            "messages[2].tool_calls[0].function.arguments",
        ),
    ],
)
def test_malformed_requests_get_openai_errors_naming_the_field(tiny, body, param):
    r = httpx.post(tiny.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]


def test_unknown_model_is_404_and_an_oversized_prompt_names_both_numbers(tiny):
    c = client(tiny)
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-5", messages=TASK)
    assert "gpt-5" in str(e.value) and "tiny" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "word " * 2000}])
    body = e.value.body
    assert body["code"] == "context_length_exceeded" and "512" in body["message"]
    n_prompt = int(body["message"].split("prompt has ")[1].split()[0])
    assert n_prompt > 512


def test_a_refused_call_leaves_the_episode_unchanged(tiny):
    c = client(tiny, "refused")
    c.chat.completions.create(model="tiny", messages=TASK, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny", messages=[*TASK, {"role": "user", "content": "word " * 2000}])
    ep = tiny.proxy.store.live["refused"]
    assert len(ep.calls) == 1 and ep.segments == 1


def test_the_token_is_required_and_hosts_and_origins_are_checked(tiny):
    body = {"model": "tiny", "messages": TASK, "max_tokens": 2}
    url = tiny.url + "/v1/chat/completions"
    assert httpx.post(url, json=body).status_code == 401
    assert (
        httpx.post(url, json=body, headers={"Authorization": "Bearer wrong-token-000000000"}).status_code
        == 401
    )
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=tiny.base_url(), api_key="nope", max_retries=0).models.list()
    ok = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.post(url, json=body, headers={**ok, "Host": "evil.example"}).status_code == 403
    assert httpx.post(url, json=body, headers={**ok, "Origin": "http://evil.example"}).status_code == 403
    assert httpx.post(url, content=b"x" * (5 * 1024 * 1024), headers=ok).status_code == 413
    assert httpx.get(tiny.url + "/health").status_code == 200
    assert [m.id for m in client(tiny).models.list().data] == ["tiny"]
    from turngym.remote.http_protocols import resolve_parser

    assert tiny.server.http_parser == resolve_parser()  # the guard's bounded protocol serves


def test_the_episode_key_comes_from_the_path_a_header_or_the_api_key(tiny):
    openai.OpenAI(
        base_url=tiny.base_url(), api_key=f"{TOKEN}@from-key", max_retries=0
    ).chat.completions.create(model="tiny", messages=TASK, max_tokens=2)
    client(tiny, default_headers={"X-Turngym-Episode": "from-header"}).chat.completions.create(
        model="tiny", messages=TASK, max_tokens=2
    )
    assert {"from-key", "from-header"} <= set(tiny.proxy.store.live)
    r = httpx.post(
        tiny.url + "/v1/episodes/bad%20key/chat/completions",
        json={"model": "tiny", "messages": TASK},
        headers={"Authorization": f"Bearer {TOKEN}"},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "episode"


def test_rewards_by_route_and_a_finished_episode_refuses_more_calls(tiny):
    c = client(tiny, "rewarded")
    c.chat.completions.create(model="tiny", messages=TASK, max_tokens=3)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    bad = httpx.post(tiny.url + "/v1/episodes/rewarded/reward", json={"reward": "lots"}, headers=auth)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reward"
    r = httpx.post(
        tiny.url + "/v1/episodes/rewarded/reward",
        json={"reward": 0.5, "components": {"x": 0.5}},
        headers=auth,
    )
    assert r.status_code == 200 and r.json()["status"] == "finished"
    with pytest.raises(openai.ConflictError):
        c.chat.completions.create(model="tiny", messages=TASK, max_tokens=3)
    got = httpx.get(tiny.url + "/v1/episodes/rewarded", headers=auth).json()
    assert got["status"] == "finished" and got["trajectory"]["turns"][0]["reward"] == 0.5
    assert httpx.get(tiny.url + "/v1/episodes/never", headers=auth).status_code == 404


def test_a_reward_function_scores_the_episode(tokenizer):
    def reward_fn(traj):
        return (1.0, {"answered": 1.0}) if traj.turns[-1].action.tool_calls else 0.0

    proxy = make_proxy(
        backend=ScriptedBackend(tokenizer, arith_policy), tokenizer=tokenizer, name="m", reward_fn=reward_fn
    )
    with serve_proxy(proxy, token=TOKEN) as running:
        client(running, "fn").chat.completions.create(model="m", messages=TASK, tools=TOOLS)
        httpx.post(
            running.url + "/v1/episodes/fn/end", headers={"Authorization": f"Bearer {TOKEN}"}
        ).raise_for_status()
    traj = proxy.store.finished["fn"]
    assert (
        not traj.masked and traj.total_reward == 1.0 and traj.turns[-1].reward_components == {"answered": 1.0}
    )


def test_a_rewritten_reply_is_a_located_drift_and_segments_split_into_trajectories(scripted):
    from turngym.proxy import split_segments

    c = client(scripted, "drifty")
    r1 = c.chat.completions.create(model="arith-expert", messages=TASK, tools=TOOLS)
    call = r1.choices[0].message.tool_calls[0]
    rewritten = {"role": "assistant", "content": f"Calling tools: {call.function.name}"}
    messages = [*TASK, rewritten, {"role": "user", "content": "Observation: 5"}]
    c.chat.completions.create(model="arith-expert", messages=messages, tools=TOOLS)
    scripted.post_reward("drifty", 0.0)
    traj = scripted.proxy.store.finished["drifty"]
    assert traj.metrics["segments"] == 2 and traj.metrics["drift"] == 1
    (drift,) = traj.metadata["drifts"]
    assert drift["reason"] == "reply_changed" and drift["message"] == 2 and drift["call"] == 1
    assert traj.metrics["reprefill_tokens"] == traj.turns[1].info["prompt_tokens"] > 0
    parts = split_segments(traj)
    assert len(parts) == 2 and [len(p.turns) for p in parts] == [1, 1]
    for part, (start, end) in zip(parts, traj.metadata["segments"], strict=True):
        assert part.token_ids == traj.token_ids[start:end]
        s, e = part.turns[0].gen_span
        assert part.loss_mask[s:e] == [1] * (e - s) and sum(part.loss_mask) == e - s
        assert part.prompt_len == s
    # the second segment's prompt is a fresh rendering of the rewritten conversation
    assert "Calling tools" in scripted.proxy.model.text_format.decode(parts[1].token_ids)


class Faulty(ScriptedBackend):
    """The scripted expert, with a bug: a prompt that mentions 'crash' raises (not a BackendError)."""

    async def _generate(self, prompt_ids, sampling, route, adapter):
        if "crash" in self.fmt.decode(prompt_ids):
            raise ZeroDivisionError("the backend's own bug")
        return await super()._generate(prompt_ids, sampling, route, adapter)


def test_a_call_route_takes_only_post_and_a_fault_of_ours_is_an_openai_500(tokenizer):
    import gc

    from turngym.proxy import server

    held = server._held[0]
    proxy = make_proxy(backend=Faulty(tokenizer, arith_policy), tokenizer=tokenizer, name="m")
    with serve_proxy(proxy, token=TOKEN) as running:
        assert gc.get_freeze_count() > 0  # the heap at start is left out of the collector's passes
        auth = {"Authorization": f"Bearer {TOKEN}"}
        got = httpx.get(running.url + "/v1/episodes/e/chat/completions", headers=auth)
        assert got.status_code == 405 and got.json()["error"]["type"] == "invalid_request_error"
        c = client(running, "e")
        c.chat.completions.create(model="m", messages=TASK)
        with pytest.raises(openai.InternalServerError) as e:
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "crash"}])
        assert e.value.body["code"] == "internal_error" and "ZeroDivisionError" in e.value.body["message"]
        with pytest.raises(openai.InternalServerError):  # streaming fails the same way, before any event
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": "crash"}], stream=True)
        assert len(proxy.store.live["e"].calls) == 1  # the failed calls left the episode as it was
        c.chat.completions.create(model="m", messages=TASK)  # and it goes on
        assert len(proxy.store.live["e"].calls) == 2
        running.post_reward("e", 1.0)
        with pytest.raises(openai.ConflictError) as e:
            c.chat.completions.create(model="m", messages=TASK)
        assert e.value.body["type"] == "invalid_request_error" and e.value.body["code"] == "episode_finished"
    assert server._held[0] == held and (held or gc.get_freeze_count() == 0)  # handed back when the last stops
