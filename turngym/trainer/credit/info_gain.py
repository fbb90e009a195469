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
Results are written to ``turn.info["info_gain"]`` of the tool turns (all turns but the last).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal

from turngym.core.types import Message, Trajectory
from turngym.trainer.credit.igpo import IG_KEY, gold_answer

IGType = Literal["prob_diff", "log_prob_diff"]

#: Default answer frame: search-qa's ``answer(text)`` tool in the Hermes convention, as its expert writes it.
DEFAULT_PREFIX = '<tool_call>{"name": "answer", "arguments": {"text": "'
DEFAULT_SUFFIX = '"}}</tool_call><|im_end|>'


def information_gain(values: list[float], ig_type: IGType = "prob_diff") -> list[float]:
    """``values`` = [ℓ_0, ℓ_1, ..., ℓ_k] -> k information gains (one per tool turn)."""
    if ig_type == "prob_diff":
        f = [math.exp(v) if math.isfinite(v) else math.nan for v in values]
    elif ig_type == "log_prob_diff":
        f = list(values)
    else:
        raise ValueError(f"unknown ig_type {ig_type!r}")
    return [b - a for a, b in zip(f, f[1:], strict=False)]


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
        import torch

        model = self.model
        device = next(model.parameters()).device
        out = [math.nan] * len(items)
        order = sorted(range(len(items)), key=lambda k: len(items[k][0]))
        batches: list[list[int]] = []
        for k in order:
            longest = len(items[k][0])
            if batches and longest * (len(batches[-1]) + 1) <= self.batch_tokens:
                batches[-1].append(k)
            else:
                batches.append([k])
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                for batch in batches:
                    for k, value in zip(batch, self._forward(batch, items, device), strict=True):
                        out[k] = value
        finally:
            model.train(was_training)
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

    # ----------------------------------------------------------------- stage
    def __call__(self, trajectories: list[Trajectory]) -> dict[str, float]:
        """Write IG into the tool turns of every trajectory with a gold answer; returns metrics."""
        t0 = time.perf_counter()
        items: list[tuple[list[int], int, int]] = []
        owners: list[tuple[int, int]] = []  # (trajectory, context index)
        failed: set[int] = set()
        for i, traj in enumerate(trajectories):
            answer = gold_answer(traj, self.answer_key)
            if answer is None or len(traj.turns) < 2:
                continue
            for c, msgs in enumerate(self.contexts(traj)):
                try:
                    enc = self.encode(self.render(msgs), answer)
                except Exception:  # noqa: BLE001 - a context that cannot be encoded: outcome-only fallback
                    failed.add(i)
                    continue
                if self.max_length is not None and len(enc[0]) > self.max_length:
                    failed.add(i)
                    continue
                items.append(enc)
                owners.append((i, c))
        values = self.answer_logprobs(items) if items else []
        per_traj: dict[int, dict[int, float]] = {}
        for (i, c), v in zip(owners, values, strict=True):
            per_traj.setdefault(i, {})[c] = v
        gains: list[float] = []
        nonfinite = 0
        for i, by_ctx in per_traj.items():
            if i in failed:
                continue
            traj = trajectories[i]
            ig = information_gain([by_ctx[c] for c in range(len(traj.turns))], self.ig_type)
            if not all(math.isfinite(g) for g in ig):
                nonfinite += 1
                continue
            for turn, g in zip(traj.turns[:-1], ig, strict=True):
                turn.info[IG_KEY] = g
            traj.metrics["ig_v0"] = by_ctx[0]
            gains.extend(ig)
        return {
            "ig/contexts": float(len(items)),
            "ig/mean": sum(gains) / len(gains) if gains else 0.0,
            "ig/positive_frac": sum(g > 0 for g in gains) / len(gains) if gains else 0.0,
            "ig/failed": float(len(failed) + nonfinite),
            "ig/seconds": time.perf_counter() - t0,
        }
