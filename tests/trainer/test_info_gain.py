"""IGPO's information gain through a real (tiny, random-init) causal LM."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turngym.core.types import Message
from turngym.trainer.credit import IGPO, CreditPipeline
from turngym.trainer.credit.info_gain import InfoGainScorer, hop_information_gain, information_gain

from .helpers import make_traj


@pytest.fixture(scope="module")
def tiny():
    from turngym.agents.models import load_model, load_tokenizer

    return load_model("tiny", device="cpu"), load_tokenizer("tiny")


def manual_logprob(model, tok, text, answer_start_char, answer_end_char):
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = torch.tensor([enc["input_ids"]])
    span = [
        k for k, (s, e) in enumerate(enc["offset_mapping"]) if s < answer_end_char and e > answer_start_char
    ]
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
    return sum(float(logp[k - 1, ids[0, k]]) for k in span) / len(span)


def test_information_gain_variants():
    values = [math.log(0.1), math.log(0.4), math.log(0.2)]
    assert information_gain(values, "prob_diff") == pytest.approx([0.3, -0.2])
    assert information_gain(values, "log_prob_diff") == pytest.approx([math.log(4), math.log(0.5)])
    assert information_gain([-1.0], "prob_diff") == []
    with pytest.raises(ValueError):
        information_gain(values, "ratio")


def test_hop_gain_credits_each_hop_once():
    """Two targets (a bridge entity, then the answer): the first search finds the bridge, the second
    the answer (and the bridge's probability falls, as the policy now names the answer), a third
    search finds nothing. The bridge search is credited; the fall is not charged back."""
    p = [[0.01, 0.01], [0.61, 0.01], [0.05, 0.81], [0.05, 0.81]]
    values = [[math.log(x) for x in row] for row in p]
    assert hop_information_gain(values, "prob_diff") == pytest.approx([0.30, 0.40, 0.0])
    # the paper's gain on the answer alone gives the bridge search nothing
    assert information_gain([row[1] for row in values], "prob_diff") == pytest.approx([0.0, 0.8, 0.0])
    assert hop_information_gain([[v[1]] for v in values], "log_prob_diff") == pytest.approx(
        [0.0, math.log(81), 0.0]
    )
    assert hop_information_gain([], "prob_diff") == []
    assert all(math.isnan(g) for g in hop_information_gain([[0.0], [math.nan]], "prob_diff"))
    with pytest.raises(ValueError, match="every target"):
        hop_information_gain([[0.0, 0.0], [0.0]], "prob_diff")


@settings(max_examples=200)
@given(
    st.integers(1, 4).flatmap(
        lambda k: st.lists(
            st.lists(st.floats(-30, 0, allow_nan=False), min_size=k, max_size=k), min_size=1, max_size=7
        )
    ),
    st.sampled_from(["prob_diff", "log_prob_diff"]),
)
def test_hop_gain_properties(values, ig_type):
    """Never negative, one gain per turn, and the gains telescope: their sum is the rise of the mean
    best belief from the question alone to the end."""
    gains = hop_information_gain(values, ig_type)
    assert len(gains) == len(values) - 1
    assert all(g >= -1e-12 for g in gains)
    f = (lambda v: math.exp(v)) if ig_type == "prob_diff" else (lambda v: v)
    best = [max(f(row[j]) for row in values) for j in range(len(values[0]))]
    first = [f(v) for v in values[0]]
    assert sum(gains) == pytest.approx(sum(best) / len(best) - sum(first) / len(first), abs=1e-9)


def test_scorer_with_hop_targets_scores_every_target(tiny):
    """``gain_targets="hops"`` scores each hop's entity and the answer after every context and writes
    the per-hop gain; a trajectory whose reference has no hop list falls back to its answer alone."""
    model, tok = tiny
    hops = make_traj(
        [0.0, 0.0, 1.0], reference={"answer": "Sammun", "hop_answers": ["Asbrael Holdings", "Sammun"]}
    )
    plain = make_traj([0.0, 1.0], reference={"answer": "Sammun"})
    s = InfoGainScorer(model, tok, gain_targets="hops")
    found = s.score([hops, plain])
    metrics = found.metrics
    assert metrics["ig/contexts"] == 3 * 2 + 2 and metrics["ig/failed"] == 0
    rows = [
        s.answer_logprobs([s.encode(s.render(c), t) for t in ("Asbrael Holdings", "Sammun")])
        for c in s.contexts(hops)
    ]
    gains = found.gains[0]
    assert gains == pytest.approx(hop_information_gain(rows, "prob_diff"), abs=1e-5)
    assert hops.metrics["ig_v0"] == pytest.approx(rows[0][1], abs=1e-5)  # the answer's, as before
    alone = s.answer_logprobs([s.encode(s.render(c), "Sammun") for c in s.contexts(plain)])
    assert found.gains[1] == pytest.approx([max(0.0, math.exp(alone[1]) - math.exp(alone[0]))], abs=1e-5)


def test_search_qa_tasks_carry_hop_answers():
    """Synthetic bridge questions list each hop's entity then the answer; IGPO reads them from the
    reference (``credit.igpo.gain_targets=hops``)."""
    from turngym.envs.search.data import synthetic_dataset

    _, tasks = synthetic_dataset(2000, 60, seed=0, mix="default")
    bridges = [t for t in tasks if t.kind == "bridge"]
    assert bridges
    for t in tasks:
        ref = t.reference()
        assert ref["hop_answers"][-1] == t.answers[0] and len(set(ref["hop_answers"])) == len(
            ref["hop_answers"]
        )
    for t in bridges:
        assert len(t.reference()["hop_answers"]) == t.hops  # one entity per hop, the answer last
        assert t.metadata["facts"][1][0] == t.reference()["hop_answers"][0]  # the bridge entity


def test_answer_span_from_offsets(tiny):
    model, tok = tiny
    s = InfoGainScorer(model, tok)
    ctx = s.render([Message(role="user", content="Where is it?")])
    ids, a, b = s.encode(ctx, "Dirkerge city")
    assert tok.decode(ids[a:b]).strip() == "Dirkerge city"
    assert tok.decode(ids[:a]).endswith('"text": "')


def test_batched_scoring_equals_one_by_one_and_a_plain_forward(tiny):
    model, tok = tiny
    s = InfoGainScorer(model, tok, batch_tokens=10_000)
    contexts = [
        s.render([Message(role="user", content="Q?")]),
        s.render([Message(role="user", content="A much longer question that pads the batch " * 3)]),
        s.render(
            [Message(role="system", content="sys"), Message(role="user", content="mid length question")]
        ),
    ]
    answers = ["Paris", "the river Thames", "1898"]
    items = [s.encode(c, a) for c, a in zip(contexts, answers, strict=True)]
    batched = s.answer_logprobs(items)
    single = [s.answer_logprobs([it])[0] for it in items]
    assert batched == pytest.approx(single, abs=1e-4)
    for c, a, v in zip(contexts, answers, batched, strict=True):
        start = len(c) + len(s.prefix)
        assert v == pytest.approx(
            manual_logprob(model, tok, c + s.prefix + a + s.suffix, start, start + len(a)), abs=1e-4
        )
    tiny_batches = InfoGainScorer(model, tok, batch_tokens=1).answer_logprobs(items)  # one per forward
    assert tiny_batches == pytest.approx(single, abs=1e-4)


def test_scorer_returns_ig_of_the_tool_turns_and_writes_nothing_into_them(tiny):
    model, tok = tiny
    ref = {"answer": ["Dirkerge", "Dirk"]}
    three = make_traj([0.0, 0.0, 1.0], reference=ref)
    one = make_traj([1.0], reference=ref)  # no tool turn: nothing to score
    unknown = make_traj([0.0, 1.0])  # no gold answer
    for ig_type in ("prob_diff", "log_prob_diff"):
        s = InfoGainScorer(model, tok, ig_type=ig_type)
        before = [[dict(t.info) for t in x.turns] for x in (three, one, unknown)]
        found = s.score([three, one, unknown])
        assert found.metrics["ig/contexts"] == 3 and found.metrics["ig/failed"] == 0
        gains, none_one, none_unknown = found.gains
        assert len(gains) == 2 and none_one is None and none_unknown is None
        values = s.answer_logprobs([s.encode(s.render(c), "Dirkerge") for c in s.contexts(three)])
        assert gains == pytest.approx(information_gain(values, ig_type), abs=1e-5)
        assert [[dict(t.info) for t in x.turns] for x in (three, one, unknown)] == before  # no side channel
    model.train()
    s.score([three])
    assert model.training  # the scorer restores the module's mode


def test_contexts_over_long_limit_fall_back(tiny):
    model, tok = tiny
    t = make_traj([0.0, 1.0], reference={"answer": "x"})
    scorer = InfoGainScorer(model, tok, max_length=5)
    found = scorer.score([t])
    assert found.metrics["ig/failed"] == 1 and found.gains == [None]
    method = IGPO(scorer=scorer)
    out = CreditPipeline(method, prepare=method.prepare)([t])
    assert out.metrics["igpo/ig_fallback"] == 1 and out.metrics["ig/failed"] == 1


@pytest.mark.slow
def test_igpo_on_search_qa_expert_trajectories(tiny):
    """Scripted-expert search-qa trajectories through the scorer and IGPO: IG on every tool turn."""
    from turngym.trainer.sft import expert_trajectories

    model, tok = tiny
    trajs = expert_trajectories("search-qa", range(4), {"n_passages": 500, "n_tasks": 50})
    assert trajs
    for t in trajs:
        t.group = "g"
    method = IGPO(scorer=InfoGainScorer(model, tok))
    out = CreditPipeline(method, prepare=method.prepare)(trajs)
    assert out.metrics["ig/contexts"] == sum(len(t.turns) for t in trajs if len(t.turns) > 1)
    assert out.metrics.get("igpo/ig_fallback", 0) == 0
    for t in trajs:
        assert all(math.isfinite(g) for g in method.gains(t)) and len(method.gains(t)) == len(t.turns) - 1


def test_shared_prefix_scoring_equals_separate_forwards_on_real_trajectories(tiny):
    """The packed layout (a trajectory's contexts share their prefix, as a KV cache would) gives the
    scores of one forward per context, in fewer tokens."""
    from turngym.trainer.sft import expert_trajectories

    model, tok = tiny
    trajs = expert_trajectories("search-qa", range(6), {"n_passages": 500, "n_tasks": 50, "hops": [2, 3]})
    assert trajs and max(len(t.turns) for t in trajs) >= 3
    packed, separate = InfoGainScorer(model, tok), InfoGainScorer(model, tok, share_prefix=False)
    groups = [
        [packed.encode(packed.render(c), t.reference["answer"]) for c in packed.contexts(t)] for t in trajs
    ]
    got = packed.shared_prefix_logprobs(groups)
    for items, values in zip(groups, got, strict=True):
        assert values == pytest.approx(separate.answer_logprobs(items), abs=1e-4)
    flat = [v for values in got for v in values]
    for small in (1, 10**9):  # one trajectory per forward, or all in one (left padding between them)
        again = InfoGainScorer(model, tok, batch_tokens=small).shared_prefix_logprobs(groups)
        assert [v for values in again for v in values] == pytest.approx(flat, abs=1e-4)
    m_packed = packed.score([t.model_copy(deep=True) for t in trajs]).metrics
    m_separate = separate.score([t.model_copy(deep=True) for t in trajs]).metrics
    assert m_packed["ig/contexts"] == m_separate["ig/contexts"]
    assert m_packed["ig/mean"] == pytest.approx(m_separate["ig/mean"], abs=1e-4)
    assert m_packed["ig/tokens"] < 0.7 * m_separate["ig/tokens"]


@settings(max_examples=25)
@given(
    st.lists(st.integers(5, 1000), min_size=4, max_size=40),
    st.lists(
        st.tuples(
            st.integers(1, 40), st.lists(st.integers(5, 1000), min_size=1, max_size=8), st.integers(0, 7)
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_packing_any_prefix_structure_matches_separate_forwards(tiny, base, tails):
    """Arbitrary contexts that branch off one sequence anywhere (even inside the answer span)."""
    model, tok = tiny
    s = InfoGainScorer(model, tok)
    items = [(list(base), len(base) - 1, len(base))]
    for cut, tail, a in tails:
        seq = base[: min(cut, len(base))] + tail
        start = min(max(1, len(seq) - len(tail) + a), len(seq) - 1)
        items.append((seq, start, len(seq)))
    got = s.shared_prefix_logprobs([items])[0]
    assert got == pytest.approx(
        InfoGainScorer(model, tok, share_prefix=False).answer_logprobs(items), abs=1e-4
    )


def test_ig_diagnostics_measure_spread_per_turn_and_separation():
    from turngym.trainer.credit.info_gain import ig_diagnostics

    def traj(task, outcome, gains, masked=False):
        return make_traj([0.0] * len(gains or [0]) + [outcome], group=task, masked=masked), gains

    def diagnostics(batch):
        return ig_diagnostics([t for t, _ in batch], [g for _, g in batch])

    batch = [
        traj("a", 1.0, [0.5, 0.3]),  # better outcome, more IG: agrees
        traj("a", 0.0, [0.1, 0.0]),
        traj("a", 0.0, [0.2, 0.2]),  # same outcome as the one above: not a pair
        traj("b", 1.0, [0.0]),  # better outcome, less IG: disagrees
        traj("b", 0.5, [0.4]),
        traj("b", 0.0, [0.4], masked=True),  # masked: ignored
    ]
    d = diagnostics(batch)
    assert d["ig/separation_pairs"] == 3  # a: (1.0 vs 0.0) twice; b: (1.0 vs 0.5)
    assert d["ig/separation"] == pytest.approx(2 / 3)
    assert d["ig/turn0_mean"] == pytest.approx((0.5 + 0.1 + 0.2 + 0.0 + 0.4) / 5)
    assert d["ig/turn1_mean"] == pytest.approx((0.3 + 0.0 + 0.2) / 3)
    gains = [0.5, 0.3, 0.1, 0.0, 0.2, 0.2, 0.0, 0.4]
    mean = sum(gains) / len(gains)
    assert d["ig/std"] == pytest.approx(math.sqrt(sum((g - mean) ** 2 for g in gains) / len(gains)))
    # what a failure collects against a success: successes a (0.8) and b (0.0); failures 0.1 and 0.4
    # (the outcome-0.5 trajectory is neither, the masked one is ignored)
    assert d["ig/total_success_mean"] == pytest.approx(0.4)
    assert d["ig/total_failure_mean"] == pytest.approx(0.25)
    assert d["ig/failure_paid_frac"] == pytest.approx(0.25 / 0.4)
    assert diagnostics([traj("c", 1.0, [0.1]), traj("c", 1.0, [0.2]), traj("c", 0.0, None)]) == {
        "ig/std": pytest.approx(0.05),
        "ig/turn0_mean": pytest.approx(0.15),
        "ig/separation_pairs": 0.0,
        "ig/total_success_mean": pytest.approx(0.15),
    }


def test_the_answer_frame_comes_from_the_parser_and_the_chat_template(tiny):
    from turngym.tools import HermesParser, OpenAIParser, TagParser
    from turngym.trainer.credit.info_gain import DEFAULT_PREFIX, DEFAULT_SUFFIX, answer_frame, end_of_turn

    _, tok = tiny  # a ChatML template: what the old hardcoded frame assumed
    assert end_of_turn(tok) == "<|im_end|>"
    assert answer_frame(HermesParser(), tok) == (DEFAULT_PREFIX, DEFAULT_SUFFIX)
    assert answer_frame(TagParser(), tok) == ("<answer> ", " </answer><|im_end|>")  # Search-R1's protocol
    assert answer_frame(TagParser(), None) == ("<answer> ", " </answer>")
    assert answer_frame(OpenAIParser(), tok) is None  # structured calls: no text frame
    assert answer_frame(TagParser({"search": ("search", "query")}), tok) is None  # no answer tag

    class Llama3:  # another template's end of turn
        def apply_chat_template(self, chat, tokenize=False):
            return "".join(
                f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content']}<|eot_id|>" for m in chat
            )

    assert end_of_turn(Llama3()) == "<|eot_id|>"


def test_igpo_scores_the_answer_in_the_envs_own_protocol(tiny):
    from turngym.tools import TagParser
    from turngym.trainer.config import load_config
    from turngym.trainer.orchestrator import build_credit

    model, tok = tiny
    cfg = load_config(
        None, ["credit.method=igpo", "rollout.env=search-qa", "rollout.env_kwargs={parser: tags}"]
    )
    scorer = build_credit(cfg, model, tok).method.scorer
    assert (scorer.prefix, scorer.suffix) == ("<answer> ", " </answer><|im_end|>")
    registered = load_config(None, ["credit.method=igpo", "rollout.env=search-r1"])  # tags by default
    assert build_credit(registered, model, tok).method.scorer.prefix == "<answer> "
    hermes = build_credit(load_config(None, ["credit.method=igpo"]), model, tok).method.scorer
    assert hermes.prefix.startswith('<tool_call>{"name": "answer"')
    explicit = load_config(
        None, ["credit.method=igpo", "credit.igpo.prefix='ANSWER: '", "credit.igpo.suffix=''"]
    )
    assert build_credit(explicit, model, tok).method.scorer.prefix == "ANSWER: "  # settings win
    assert TagParser().parse(scorer.prefix + "Paris" + " </answer>").valid_calls[0].arguments == {
        "text": "Paris"
    }


def test_hop_targets_are_a_config_key(tiny):
    from turngym.trainer.config import load_config
    from turngym.trainer.orchestrator import build_credit

    model, tok = tiny
    scorer = build_credit(
        load_config(None, ["credit.method=igpo", "credit.igpo.gain_targets=hops"]), model, tok
    ).method.scorer
    assert (scorer.gain_targets, scorer.hops_key) == ("hops", "hop_answers")
    assert (
        build_credit(load_config(None, ["credit.method=igpo"]), model, tok).method.scorer.gain_targets
        == "answer"
    )
    with pytest.raises(Exception, match="gain_targets"):
        build_credit(load_config(None, ["credit.method=igpo", "credit.igpo.gain_targets=chain"]), model, tok)
