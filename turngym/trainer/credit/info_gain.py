"""IGPO's information gain: how much each tool turn raised the policy's belief in the gold answer.

For a context c (the conversation so far, rendered with the chat template and its generation
prompt) the value is ``ℓ(c)`` = the mean log-probability, under the current policy with no
gradient, of the gold answer's tokens in ``render(c) + prefix + answer + suffix``; the answer's
tokens are found with the tokenizer's offset mapping. With ``v_0`` the value of the question alone
and ``v_t`` the value after tool turn t's observation:

* ``ig_type="prob_diff"`` (the paper):     IG_t = exp(ℓ_t) - exp(ℓ_{t-1})
* ``ig_type="log_prob_diff"`` (its script): IG_t = ℓ_t - ℓ_{t-1}

All pending contexts of a step (every trajectory, every turn) are scored together: sorted by
length and packed into left-padded batches of at most ``batch_tokens`` tokens, each one forward.
With ``share_prefix`` (the default) the contexts of one trajectory share their common prefix, as a
prefix KV cache would: the trajectory's longest scoring sequence is laid out once and every other
context contributes only the tokens after its common prefix with it, each such tail attending to
its own prefix and itself through a 4-D attention mask, with the positions it would have alone.
The scores are those of separate forwards (tested to 1e-5), at the cost of about one pass over the
trajectory instead of one per turn. :meth:`InfoGainScorer.score` returns the gains, one list per
trajectory (one gain per tool turn: all turns but the last), for IGPO to read; nothing is written
into the turns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from turngym.core.types import Message, ToolCall, Trajectory
from turngym.trainer.credit.pipeline import group_key

IGType = Literal["prob_diff", "log_prob_diff"]
Item = tuple[list[int], int, int]  # token ids, [start, end) of the answer span

#: Default answer frame: search-qa's ``answer(text)`` tool in the Hermes convention, as its expert writes it.
DEFAULT_PREFIX = '<tool_call>{"name": "answer", "arguments": {"text": "'
DEFAULT_SUFFIX = '"}}</tool_call><|im_end|>'


_MARK = "TURNGYM_ANSWER_MARK"


@dataclass
class InfoGains:
    """What one scoring pass found: ``gains[i]`` is trajectory i's information gain, one value per
    tool turn, or None where it has none (no gold answer, no tool turn, a context that could not be
    scored, a non-finite value); ``metrics`` are the step's ``ig/*`` metrics."""

    gains: list[list[float] | None]
    metrics: dict[str, float]


def gold_answer(traj: Trajectory, key: str = "answer") -> str | None:
    """The gold answer (first alternative when several) from the trajectory's reference, as text."""
    value = traj.reference.get(key)
    if isinstance(value, (list, tuple)):
        value = value[0] if value else None
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    return str(value)


def answer_frame(
    parser: Any, tokenizer: Any = None, tool: str = "answer", arg: str = "text"
) -> tuple[str, str] | None:
    """``(prefix, suffix)`` around an answer as the policy writes it: the parser's way of calling
    ``tool(arg=...)`` (``parser.format_call``), followed by the chat template's end of an assistant
    turn when ``tokenizer`` is given. None when the parser writes calls as structured messages or
    cannot write this tool (the caller then needs an explicit frame)."""
    try:
        action = parser.format_call(ToolCall(name=tool, arguments={arg: _MARK}))
    except (AttributeError, ValueError):
        return None
    if not isinstance(action, str) or action.count(_MARK) != 1:
        return None
    prefix, suffix = action.split(_MARK)
    return prefix, suffix + (end_of_turn(tokenizer) if tokenizer is not None else "")


def end_of_turn(tokenizer: Any) -> str:
    """What the chat template writes right after an assistant message's text (``<|im_end|>`` for
    ChatML, ``<|eot_id|>`` for Llama 3); "" when it cannot be found."""
    chat = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot render this: no end marker
        return ""
    if not isinstance(text, str) or _MARK not in text:
        return ""
    return text.split(_MARK, 1)[1].rstrip()


def _belief(values: list[float], ig_type: IGType) -> list[float]:
    if ig_type == "prob_diff":
        return [math.exp(v) if math.isfinite(v) else math.nan for v in values]
    if ig_type == "log_prob_diff":
        return list(values)
    raise ValueError(f"unknown ig_type {ig_type!r}")


def information_gain(values: list[float], ig_type: IGType = "prob_diff") -> list[float]:
    """``values`` = [ℓ_0, ℓ_1, ..., ℓ_k] -> k information gains (one per tool turn)."""
    f = _belief(values, ig_type)
    return [b - a for a, b in zip(f, f[1:], strict=False)]


def hop_information_gain(values: list[list[float]], ig_type: IGType = "prob_diff") -> list[float]:
    """Information gain over several targets (``gain_targets="hops"``): ``values[c][j]`` = ℓ of
    target j (each hop's entity, the final answer last) after context c. A turn's gain is the rise of
    the mean over targets of the best belief reached so far in each: ``B_c = mean_j max_{c'<=c}
    f(ℓ_{c'j})`` with f = exp (``prob_diff``) or the identity (``log_prob_diff``), ``IG_t = B_{t+1} -
    B_t``. The running maximum keeps a found hop credited once: after the second search the policy
    would answer the second hop's entity, not the bridge's, and the bridge search must not pay that
    back. With one target this is the plain gain on a running maximum (never negative)."""
    if not values:
        return []
    width = len(values[0])
    if width == 0 or any(len(row) != width for row in values):
        raise ValueError("every context needs a value for every target")
    best = [-math.inf] * width
    levels = []
    for row in values:
        f = _belief(row, ig_type)
        if not all(math.isfinite(x) for x in f):
            return [math.nan] * (len(values) - 1)
        best = [max(b, x) for b, x in zip(best, f, strict=True)]
        levels.append(sum(best) / width)
    return [b - a for a, b in zip(levels, levels[1:], strict=False)]


@dataclass
class InfoGainScorer:
    """Scores gold answers after each turn with a Hugging Face causal LM (the training model)."""

    model: Any
    tokenizer: Any
    ig_type: IGType = "prob_diff"
    prefix: str = DEFAULT_PREFIX
    suffix: str = DEFAULT_SUFFIX
    answer_key: str = "answer"
    batch_tokens: int = 32768
    max_length: int | None = None
    template_kwargs: dict[str, Any] | None = None
    share_prefix: bool = True
    # "answer": the gold answer alone (the paper); "hops": every hop's entity in the reference's
    # ``hops_key`` list (final answer last; search-qa's ``hop_answers``), see hop_information_gain
    gain_targets: Literal["answer", "hops"] = "answer"
    hops_key: str = "hop_answers"

    def targets(self, traj: Trajectory) -> list[str] | None:
        """What is scored after each context: ``[answer]``, or the hop targets when asked for and
        present (a trajectory whose reference has none falls back to its answer alone)."""
        answer = gold_answer(traj, self.answer_key)
        if self.gain_targets == "hops":
            hops = traj.reference.get(self.hops_key)
            if (
                isinstance(hops, (list, tuple))
                and hops
                and all(isinstance(h, str) and h.strip() for h in hops)
            ):
                return list(hops)
        return None if answer is None else [answer]

    # ------------------------------------------------------------ contexts
    def render(self, messages: list[Message]) -> str:
        chat = [m.to_chat() for m in messages]
        return self.tokenizer.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True, **(self.template_kwargs or {})
        )

    def contexts(self, traj: Trajectory) -> list[list[Message]]:
        """The question alone, then the conversation after each tool turn's observation."""
        out = [list(traj.prompt)]
        msgs = list(traj.prompt)
        for turn in traj.turns[:-1]:
            msgs = [*msgs, turn.action, *turn.observation]
            out.append(msgs)
        return out

    def encode(self, context: str, answer: str) -> tuple[list[int], int, int]:
        """Token ids of ``context + prefix + answer + suffix`` and the ``[start, end)`` token span of the answer."""
        text = context + self.prefix + answer + self.suffix
        a0 = len(context) + len(self.prefix)
        a1 = a0 + len(answer)
        enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
        span = [k for k, (s, e) in enumerate(offsets) if s < a1 and e > a0]
        if not span:
            raise ValueError(f"the answer {answer!r} maps to no token")
        return ids, span[0], span[-1] + 1

    # -------------------------------------------------------------- scoring
    def answer_logprobs(self, items: list[tuple[list[int], int, int]]) -> list[float]:
        """ℓ for each ``(ids, start, end)``: mean log p of ids[start:end], batched by length."""
        device = next(self.model.parameters()).device
        return self._batched([len(it[0]) for it in items], lambda batch: self._forward(batch, items, device))

    def _batched(self, lengths: list[int], forward: Any) -> list[Any]:
        """``forward(batch)`` over batches of indices (sorted by length, each batch's rows times its
        longest length within ``batch_tokens``), in eval mode without gradients; the results in the
        order of ``lengths``. The module's training mode is restored after."""
        import torch

        out: list[Any] = [None] * len(lengths)
        batches: list[list[int]] = []
        for k in sorted(range(len(lengths)), key=lambda k: lengths[k]):
            if batches and lengths[k] * (len(batches[-1]) + 1) <= self.batch_tokens:
                batches[-1].append(k)
            else:
                batches.append([k])
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                for batch in batches:
                    for k, value in zip(batch, forward(batch), strict=True):
                        out[k] = value
        finally:
            self.model.train(was_training)
        return out

    def _forward(self, batch: list[int], items, device) -> list[float]:
        import torch

        width = max(len(items[k][0]) for k in batch)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, k in enumerate(batch):  # left padding: every answer sits near the right edge
            seq = items[k][0]
            ids[row, width - len(seq) :] = torch.tensor(seq)
            mask[row, width - len(seq) :] = 1
        # logits are needed only from the first answer token's predecessor onwards
        keep = max(len(items[k][0]) - items[k][1] for k in batch) + 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs = dict(
            input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=position_ids.to(device)
        )
        try:
            logits = self.model(**kwargs, logits_to_keep=keep).logits
        except TypeError:  # models without logits_to_keep
            logits = self.model(**kwargs).logits[:, -keep:]
        logp = torch.log_softmax(logits.float(), dim=-1)
        values = []
        for row, k in enumerate(batch):
            seq, start, end = items[k]
            offset = width - keep  # column 0 of ``logits`` predicts position offset + 1
            targets = torch.tensor(seq[start:end], device=logp.device)
            cols = torch.arange(start, end, device=logp.device) + (width - len(seq)) - 1 - offset
            values.append(float(logp[row, cols, targets].mean()))
        return values

    def shared_prefix_logprobs(self, groups: list[list[Item]]) -> list[list[float]]:
        """ℓ for each item of each group (a group = one trajectory's contexts), scoring every group
        as one packed sequence that holds the shared prefix once (see the module docstring)."""
        return self.packed_logprobs([_Pack.of(items) for items in groups])

    def packed_logprobs(self, packs: list[_Pack]) -> list[list[float]]:
        device = next(self.model.parameters()).device
        return self._batched(
            [len(p.ids) for p in packs], lambda batch: self._forward_packed([packs[k] for k in batch], device)
        )

    def _forward_packed(self, packs: list[_Pack], device) -> list[list[float]]:
        import torch

        width = max(len(p.ids) for p in packs)
        dtype = next(self.model.parameters()).dtype
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(packs), width), pad, dtype=torch.long)
        pos = torch.zeros((len(packs), width), dtype=torch.long)
        allow = torch.zeros((len(packs), 1, width, width), dtype=torch.bool)
        for row, p in enumerate(packs):
            o = width - len(p.ids)  # left padding
            ids[row, o:] = torch.tensor(p.ids)
            pos[row, o:] = torch.tensor(p.positions)
            pad_rows = torch.arange(o)
            allow[row, 0, pad_rows, pad_rows] = True  # padding attends to itself only (no empty rows)
            for start, length, cut in p.blocks:
                rows = slice(o + start, o + start + length)
                allow[row, 0, rows, o : o + cut] = True
                allow[row, 0, rows, rows] = torch.tril(torch.ones(length, length, dtype=torch.bool))
        mask = torch.zeros(allow.shape, dtype=dtype).masked_fill_(~allow, torch.finfo(dtype).min)
        hidden = self.model.get_decoder()(
            input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=pos.to(device)
        ).last_hidden_state
        head = self.model.get_output_embeddings()
        values = []
        for row, p in enumerate(packs):
            o = width - len(p.ids)
            flat = [(k, at, target) for k, reads in enumerate(p.reads) for at, target in reads]
            at = torch.tensor([o + a for _, a, _ in flat], device=hidden.device)
            logp = torch.log_softmax(head(hidden[row, at]).float(), dim=-1)
            picked = logp[torch.arange(len(flat), device=logp.device), torch.tensor([t for *_, t in flat])]
            sums = [0.0] * len(p.reads)
            for (k, _, _), v in zip(flat, picked.tolist(), strict=True):
                sums[k] += v
            values.append([total / len(reads) for total, reads in zip(sums, p.reads, strict=True)])
        return values

    # ----------------------------------------------------------------- stage
    def score(self, trajectories: list[Trajectory]) -> InfoGains:
        """The information gain of the tool turns of every trajectory with a gold answer."""
        t0 = time.perf_counter()
        items: list[Item] = []
        owners: list[tuple[int, int]] = []  # (trajectory, context index)
        which: list[int] = []  # the target each item scores
        failed: set[int] = set()
        for i, traj in enumerate(trajectories):
            targets = self.targets(traj)
            if targets is None or len(traj.turns) < 2:
                continue
            for c, msgs in enumerate(self.contexts(traj)):
                context = self.render(msgs)
                for j, target in enumerate(targets):
                    try:
                        enc = self.encode(context, target)
                    except Exception:  # noqa: BLE001 - a context that cannot be encoded: outcome-only fallback
                        failed.add(i)
                        continue
                    if self.max_length is not None and len(enc[0]) > self.max_length:
                        failed.add(i)
                        continue
                    items.append(enc)
                    owners.append((i, c))
                    which.append(j)
        if not items:
            values: list[float] = []
        elif self.share_prefix:
            groups = _by_owner(owners)
            packs = [_Pack.of([items[k] for k in ks]) for ks in groups]
            values = [math.nan] * len(items)
            for ks, vs in zip(groups, self.packed_logprobs(packs), strict=True):
                for k, v in zip(ks, vs, strict=True):
                    values[k] = v
        else:
            values = self.answer_logprobs(items)
        tokens = (
            sum(len(p.ids) for p in packs) if items and self.share_prefix else sum(len(x[0]) for x in items)
        )
        per_traj: dict[int, dict[int, dict[int, float]]] = {}
        for (i, c), j, v in zip(owners, which, values, strict=True):
            per_traj.setdefault(i, {}).setdefault(c, {})[j] = v
        out: list[list[float] | None] = [None] * len(trajectories)
        nonfinite = 0
        for i, by_ctx in per_traj.items():
            if i in failed:
                continue
            traj = trajectories[i]
            rows = [[by_ctx[c][j] for j in sorted(by_ctx[c])] for c in range(len(traj.turns))]
            if self.gain_targets == "hops":
                ig = hop_information_gain(rows, self.ig_type)
            else:
                ig = information_gain([row[0] for row in rows], self.ig_type)
            if not all(math.isfinite(g) for g in ig):
                nonfinite += 1
                continue
            out[i] = ig
            traj.metrics["ig_v0"] = by_ctx[0][max(by_ctx[0])]  # the final answer's (last target)
        gains = [g for ig in out if ig is not None for g in ig]
        metrics = {
            "ig/contexts": float(len(items)),
            "ig/tokens": float(tokens),
            "ig/mean": sum(gains) / len(gains) if gains else 0.0,
            "ig/positive_frac": sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
            "ig/failed": float(len(failed) + nonfinite),
            "ig/seconds": time.perf_counter() - t0,
            **ig_diagnostics(trajectories, out),
        }
        return InfoGains(out, metrics)


def ig_diagnostics(trajectories: list[Trajectory], found: list[list[float] | None]) -> dict[str, float]:
    """How informative the information gain was in this batch (for the learning report).

    ``ig/std``: spread of per-turn IG. ``ig/turn{k}_mean``: mean IG of tool turn k (0-based).
    ``ig/separation``: over pairs of trajectories of one task with different outcomes, the share in
    which the better one collected more total IG (0.5 = IG says nothing about the outcome; ties 0.5).
    ``ig/separation_pairs``: how many such pairs there were.
    ``ig/total_success_mean`` / ``ig/total_failure_mean``: mean total IG of the trajectories that
    succeeded (terminated with outcome >= 1, as ``reward/success`` counts) and of those that failed
    (outcome <= 0); ``ig/failure_paid_frac``, their ratio: how much of a success's dense reward a
    failure collects anyway (per-hop gain on 2+3-hop search-qa: a 3-hop question answered wrongly after
    two searches has found two of its three targets). ``found[i]``: trajectory i's gains (None: none).
    """

    per_turn: dict[int, list[float]] = {}
    totals: dict[str, list[tuple[float, float]]] = {}
    gains: list[float] = []
    by_result: dict[str, list[float]] = {"success": [], "failure": []}
    for t, ig in zip(trajectories, found, strict=True):
        if not ig or t.masked:
            continue
        gains += ig
        for k, g in enumerate(ig):
            per_turn.setdefault(k, []).append(g)
        total = sum(ig)
        totals.setdefault(group_key(t), []).append((t.outcome, total))
        if t.terminated and t.outcome >= 1.0:
            by_result["success"].append(total)
        elif t.outcome <= 0.0:
            by_result["failure"].append(total)
    out: dict[str, float] = {}
    if gains:
        mean = sum(gains) / len(gains)
        out["ig/std"] = math.sqrt(sum((g - mean) ** 2 for g in gains) / len(gains))
    for k in sorted(per_turn)[:4]:
        out[f"ig/turn{k}_mean"] = sum(per_turn[k]) / len(per_turn[k])
    for name, totals_of in by_result.items():
        if totals_of:
            out[f"ig/total_{name}_mean"] = sum(totals_of) / len(totals_of)
    won, lost = out.get("ig/total_success_mean"), out.get("ig/total_failure_mean")
    if won is not None and lost is not None and won > 0:
        out["ig/failure_paid_frac"] = lost / won
    agree = pairs = 0.0
    for group in totals.values():
        for a in range(len(group)):
            for b in range(a + 1, len(group)):
                (oa, ga), (ob, gb) = group[a], group[b]
                if oa == ob:
                    continue
                pairs += 1
                better, worse = (ga, gb) if oa > ob else (gb, ga)
                agree += 1.0 if better > worse else 0.5 if better == worse else 0.0
    if pairs:
        out["ig/separation"] = agree / pairs
    out["ig/separation_pairs"] = pairs
    return out


def _by_owner(owners: list[tuple[int, int]]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for k, (i, _) in enumerate(owners):
        groups.setdefault(i, []).append(k)
    return list(groups.values())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    k = 0
    while k < n and a[k] == b[k]:
        k += 1
    return k


@dataclass
class _Pack:
    """One trajectory's scoring sequences laid out as one: the longest in full, then the tail of every
    other one after its common prefix with it. ``blocks`` are (start, length, cut): causal runs that
    also see packed positions [0, cut); ``reads[k]`` are (packed index, target id) pairs whose
    log-probabilities average to item k's value."""

    ids: list[int]
    positions: list[int]
    blocks: list[tuple[int, int, int]]
    reads: list[list[tuple[int, int]]]

    @classmethod
    def of(cls, items: list[Item]) -> _Pack:
        base = max(items, key=lambda it: len(it[0]))[0]
        ids, positions, blocks = list(base), list(range(len(base))), [(0, len(base), 0)]
        reads = []
        for seq, start, end in items:
            cut = _common_prefix(seq, base)
            offset = len(ids)
            if cut < len(seq):
                ids += seq[cut:]
                positions += range(cut, len(seq))
                blocks.append((offset, len(seq) - cut, cut))
            # the logits at position p - 1 predict token p; positions before ``cut`` are the base's
            reads.append(
                [(p - 1 if p - 1 < cut else offset + p - 1 - cut, seq[p]) for p in range(start, end)]
            )
        return cls(ids, positions, blocks, reads)
