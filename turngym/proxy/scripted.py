"""Token backends without a neural network, for demos, tests and the overhead benchmark.

* ``ScriptedBackend(tokenizer, policy)``: the reply is ``policy(prompt_text)`` encoded with the
  tokenizer, then its stop token (cut at ``max_tokens``); logprobs 0. A real ``TokenBackend``: the
  proxy cannot tell it from a model, so a harness can play an env to its end through it.
* ``arith_policy``: a policy that solves ``arith`` through native tool calls (Hermes convention),
  one ``calculate`` per operation, then ``answer`` (then ``final_answer`` where the harness offers
  one, else a sentence); it reads the expression and counts the assistant turns already in the
  prompt (ChatML templates: ``<|im_start|>assistant``).
* ``InstantBackend(tokenizer, n_tokens)``: ``n_tokens`` fixed ids at once (the benchmark's floor).
"""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable
from typing import Any

from turngym.agents.backend import Generation, SamplingParams, TokenBackend
from turngym.agents.chat import ChatFormat


def end_of_turn(fmt: ChatFormat) -> int:
    """The stop token the template closes an assistant turn with (``<|im_end|>``), else the lowest stop id."""
    return next((t for t in fmt.assistant_suffix_ids if t in fmt.stop_token_ids), min(fmt.stop_token_ids))


class ScriptedBackend(TokenBackend):
    no_adapters = "a scripted backend serves no adapters"

    def __init__(self, tokenizer: Any, policy: Callable[[str], str]):
        self.fmt = ChatFormat(tokenizer)
        self.policy = policy
        self.stop = end_of_turn(self.fmt)
        self.calls = 0

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        self.calls += 1
        text = self.policy(self.fmt.tokenizer.decode(prompt_ids, skip_special_tokens=False))
        ids = [*self.fmt.encode(text), self.stop]
        finish = "stop"
        if len(ids) > sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        return Generation(ids, [0.0] * len(ids), finish, self.fmt.decode(ids), prompt_len=len(prompt_ids))

    async def aclose(self) -> None:
        return None


class InstantBackend(TokenBackend):
    """``n_tokens`` copies of one ordinary token, at once: what the proxy costs without a model."""

    no_adapters = "an instant backend serves no adapters"

    def __init__(self, tokenizer: Any, n_tokens: int = 16):
        fmt = ChatFormat(tokenizer)
        self.token = fmt.encode(" the")[0]
        self.stop = end_of_turn(fmt)
        self.n_tokens = n_tokens

    async def _generate(
        self, prompt_ids: list[int], sampling: SamplingParams, route: str | None, adapter: str | None
    ) -> Generation:
        n = min(self.n_tokens, sampling.max_tokens)
        ids = [self.token] * (n - 1) + [self.stop] if n > 1 else [self.token]
        return Generation(ids, [0.0] * len(ids), "stop" if n > 1 else "length", prompt_len=len(prompt_ids))

    async def aclose(self) -> None:
        return None


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*"}


def _steps(expr: str) -> tuple[list[tuple[int, str, int]], int]:
    """The operations of ``expr`` in evaluation order (leftmost innermost first) and its value."""
    out: list[tuple[int, str, int]] = []

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            a, b = walk(node.left), walk(node.right)
            out.append((a, _SYMBOL[type(node.op)], b))
            return _OPS[type(node.op)](a, b)
        raise ValueError(f"not an arith expression: {ast.dump(node)[:80]}")

    value = walk(ast.parse(expr, mode="eval").body)
    return out, value


def arith_policy(prompt: str) -> str:
    """The next tool call for the ``arith`` task in ``prompt`` (a rendered chat), Hermes style."""
    m = re.search(r"Evaluate: ([0-9()+\-* ]+)", prompt)
    if m is None:
        return "I see no expression to evaluate."
    steps, value = _steps(m.group(1).strip())
    done = prompt.count("<|im_start|>assistant") - 1  # the last one is the generation prompt
    if done < len(steps):
        a, op, b = steps[done]
        call: dict[str, Any] = {"name": "calculate", "arguments": {"a": a, "op": op, "b": b}}
    elif done == len(steps):
        call = {"name": "answer", "arguments": {"value": value}}
    elif '"final_answer"' in prompt:
        call = {"name": "final_answer", "arguments": {"answer": str(value)}}
    else:
        return f"The value is {value}."
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
