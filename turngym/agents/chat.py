"""Token bookkeeping for multi-turn chat: the ids a model saw, the ids it sampled, and the masks.

``ChatFormat`` renders conversations with a tokenizer's chat template. ``ChatTokens`` keeps one
trajectory's token sequence as it grows turn by turn:

* the first prompt is the template's rendering of the first observation plus the generation prompt;
* sampled ids are appended exactly as sampled (loss mask 1, their logprobs);
* after the env answers, the observation ids are the *template delta*: the rendering of the
  conversation with the observation and the next generation prompt, minus the rendering up to the
  end of the assistant turn. The template's closing tokens of the assistant turn that the model did
  not sample (``\\n`` after ``<|im_end|>``, or the whole closing when generation hit ``max_tokens``)
  are appended with the observation (loss mask 0);
* on every turn the new rendering must extend the previous one token for token. A template that
  rewrites history (e.g. drops earlier reasoning blocks) violates this: ``TokenMismatch`` is raised
  and the rollout engine masks the trajectory with reason ``token_mismatch``.

The sequence tiles as ``prompt | gen_0 | obs_0 | gen_1 | obs_1 | ... | gen_last``: each turn's
``gen_span``/``obs_span`` are half-open ranges into ``token_ids``; the final observation (after the
episode ended) is not tokenised, so the last turn has ``obs_span = None``. How the per-turn cost is
kept low (a direct template render, a piece cache, encoding only the new text) is in docs/api.md.

Tool instructions: by default the environment writes them into its system prompt
(``tools_in_prompt=True``) and no ``tools`` are passed to the template. To use a template's native
tool rendering instead, build the env with ``tools_in_prompt=False`` and the agent with
``native_tools=True`` (the agent then passes ``env.tools`` to the template); the engine refuses the
mix of both, which would show the model the tools twice.
"""

from __future__ import annotations

import functools
import inspect
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from turngym.core.types import Message

_SENTINEL = "\u2063TURNGYM_SENTINEL\u2063"


class TokenMismatch(Exception):
    """The re-rendered conversation does not extend the previous rendering token for token."""


class ImagesNotSupported(ValueError):
    """The conversation carries images but the model's tokenizer is text-only."""


class ChatFormat:
    """A tokenizer plus its chat template (and optional native tools).

    ``encode`` splits a text at its anchor special tokens (see ``_split_anchors``) and keeps the ids
    of each piece in an LRU cache of ``cache_chars`` characters (0 disables it): the system prompt
    shared by every task, the repeated generation prompts and recurring observations are tokenized
    once. The result is exactly the tokenizer's own encoding of the whole text."""

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        *,
        cache_chars: int = 1 << 22,
    ):
        if getattr(tokenizer, "chat_template", None) is None:
            raise ValueError("the tokenizer has no chat template")
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self._anchors = _split_anchors(tokenizer)
        self._anchor_ids = {content: tid for tid, content in self._anchors.items()}
        self._splitter = _added_token_pattern(tokenizer) if self._anchors else None
        self.pieces = PieceCache(cache_chars)
        self._raw = _raw_tokenizer(tokenizer)
        self._split_specials = bool(getattr(tokenizer, "split_special_tokens", False))
        self._template = _DirectTemplate.build(tokenizer, self.tools, self.template_kwargs)
        self.stop_token_ids = _stop_ids(tokenizer)
        self.assistant_suffix_ids = self._assistant_suffix()

    def render(self, messages: list[Message] | list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.render_chat(self.to_chat(messages), add_generation_prompt)

    def to_chat(self, messages: list[Message] | list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The dicts the template takes; refuses images (text-only tokenizers)."""
        n_images = sum(len(m.images) for m in messages if isinstance(m, Message))
        if n_images:
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            raise ImagesNotSupported(
                f"the conversation carries {n_images} image(s) but {name!r} is a text-only tokenizer: token "
                "bookkeeping for images is not supported. Use a backend that accepts images (the OpenAI-chat "
                "backend with a vision model), or an env option without screenshots (e.g. web-miniwob's "
                "DOM observation)."
            )
        return [m.to_chat() if isinstance(m, Message) else m for m in messages]

    def render_chat(self, chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        if self._template is not None and chat:
            return self._template.render(chat, add_generation_prompt)
        return self._apply_template(chat, add_generation_prompt)

    def _apply_template(self, chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The reference rendering: the tokenizer's ``apply_chat_template``."""
        return self.tokenizer.apply_chat_template(
            chat,
            tools=self.tools,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """``tokenizer.encode(text, add_special_tokens=False)``, piece by piece through the cache."""
        if self._splitter is None:
            return list(self._encode_piece(text))
        ids: list[int] = []
        pos = 0
        for m in self._splitter.finditer(text):
            tid = self._anchor_ids.get(m.group())
            if tid is None:  # an added token that is no anchor stays inside its piece
                continue
            if m.start() > pos:
                ids.extend(self._encode_piece(text[pos : m.start()]))
            ids.append(tid)
            pos = m.end()
        if pos < len(text):
            ids.extend(self._encode_piece(text[pos:]))
        return ids

    def _encode_piece(self, text: str) -> Sequence[int]:
        ids = self.pieces.get(text)
        if ids is None:
            ids = array("i", self._encode_uncached(text))
            self.pieces.put(text, ids)
        return ids

    def _encode_uncached(self, text: str) -> list[int]:
        """The tokenizer's encoding; straight from its Rust tokenizer where that is what transformers
        would call anyway (no padding, truncation or special-token setting to reset first)."""
        raw = self._raw
        if (
            raw is not None
            and raw.truncation is None
            and raw.padding is None
            and raw.encode_special_tokens == self._split_specials
        ):
            return raw.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_extending(self, text: str, prev_text: str, prev_ids: Sequence[int]) -> list[int]:
        """``encode(text)`` for a ``text`` that extends ``prev_text`` (whose ids are ``prev_ids``).

        The ids up to ``prev_text``'s last anchor token are reused and only the rest is encoded, so
        a turn costs the new text, not the conversation. This is exact because a tokenizer splits its
        added tokens out before normalizing and pre-tokenizing the pieces between them. Where that
        cannot be relied on (see ``_split_anchors``), or ``text`` differs from ``prev_text`` before
        that token, the whole text is encoded."""
        keep, ids = self.extension(text, prev_text, prev_ids)
        return [*prev_ids[:keep], *ids]

    def extension(self, text: str, prev_text: str, *prev_parts: Sequence[int]) -> tuple[int, list[int]]:
        """``(keep, ids)`` with ``encode(text) == prev_ids[:keep] + ids``, where ``prev_ids`` (the ids
        of ``prev_text``) may be given in consecutive parts; see ``encode_extending``."""
        offset = sum(len(part) for part in prev_parts)
        for part in reversed(prev_parts):
            offset -= len(part)
            for k in range(len(part) - 1, -1, -1):
                content = self._anchors.get(part[k])
                if content is None:
                    continue
                end = prev_text.rfind(content)
                if end >= 0:
                    end += len(content)
                    if len(text) >= end and text.startswith(prev_text[:end]):
                        return offset + k + 1, self.encode(text[end:])
                return 0, self.encode(text)
        return 0, self.encode(text)

    def decode(self, ids: list[int]) -> str:
        if self._raw is not None and not self.tokenizer.clean_up_tokenization_spaces:
            return self._raw.decode(ids, skip_special_tokens=True)
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _assistant_suffix(self) -> list[int]:
        """The ids the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""
        msgs = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}]
        text = self.render(msgs, add_generation_prompt=False)
        idx = text.rfind(_SENTINEL)
        if idx < 0:
            raise ValueError("the chat template does not render assistant content verbatim")
        return self.encode(text[idx + len(_SENTINEL) :])


def template_problem(tokenizer: Any) -> str | None:
    """None if the tokenizer's chat template can be extended turn by turn (each new prompt starts with
    the tokens already kept: the bookkeeping multi-turn RL needs); else one line saying what breaks.

    Probes a short conversation (system, user, an assistant tool call, a tool result, a second
    assistant turn) through :class:`ChatTokens`, the same code the rollouts use.
    """
    try:
        fmt = ChatFormat(tokenizer)
        prompt = [Message(role="system", content="You answer."), Message(role="user", content="Question?")]
        tokens = ChatTokens(fmt, prompt)
        stop = sorted(fmt.stop_token_ids)[:1]
        for k in range(2):
            text = f'<tool_call>{{"name": "search", "arguments": {{"q": "{k}"}}}}</tool_call>'
            ids = fmt.encode(text) + stop
            tokens.add_generation(ids, [0.0] * len(ids))
            tokens.add_observation(
                Message(role="assistant", content=text), [Message(role="tool", content=f"r{k}")]
            )
    except TokenMismatch as e:
        return f"the chat template cannot be extended turn by turn ({str(e).splitlines()[0][:200]})"
    except Exception as e:  # noqa: BLE001 - a template that cannot even render these messages
        return f"the chat template cannot render a tool conversation ({type(e).__name__}: {str(e)[:200]})"
    return None


class ChatTokens:
    """One trajectory's token sequence, loss mask and logprobs (see the module docstring).

    ``token_ids`` / ``loss_mask`` / ``logprobs`` are compact ``array``s (int32 / int8 / float64:
    a live trajectory costs ~13 bytes per token instead of ~70 for Python lists); ``list(...)``
    them where a list is needed.
    """

    def __init__(self, fmt: ChatFormat, prompt: list[Message]):
        self.fmt = fmt
        self.messages: list[Message] = list(prompt)
        self._chat = fmt.to_chat(self.messages)  # the template's dicts, converted once per message
        self._text = fmt.render_chat(self._chat, add_generation_prompt=True)
        self._rendered = array("i", fmt.encode(self._text))
        self.token_ids = array("i", self._rendered)
        self.loss_mask = array("b", bytes(len(self.token_ids)))
        self.logprobs = array("d", bytes(8 * len(self.token_ids)))
        self.prompt_len = len(self.token_ids)
        self.retokenization_drift = 0  # turns whose sampled ids differ from the template's re-rendering
        self._last_gen: list[int] = []

    def __len__(self) -> int:
        return len(self.token_ids)

    def copy(self) -> ChatTokens:
        """An independent copy (the arrays and lists copied; the format shared): a tree branch."""
        new = object.__new__(ChatTokens)
        new.__dict__.update(self.__dict__)
        new.messages = list(self.messages)
        new._chat = list(self._chat)
        new._rendered = array("i", self._rendered)
        new.token_ids = array("i", self.token_ids)
        new.loss_mask = array("b", self.loss_mask)
        new.logprobs = array("d", self.logprobs)
        new._last_gen = list(self._last_gen)
        return new

    def add_generation(self, token_ids: list[int], logprobs: list[float]) -> tuple[int, int]:
        """Append sampled ids (loss mask 1); returns their span."""
        if len(token_ids) != len(logprobs):
            raise ValueError("token_ids and logprobs differ in length")
        start = len(self.token_ids)
        self.token_ids.extend(token_ids)
        self.loss_mask.extend(b"\x01" * len(token_ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self._last_gen = list(token_ids)
        return start, len(self.token_ids)

    def add_observation(self, action: Message, observation: list[Message]) -> tuple[int, int]:
        """Append the template delta for ``action`` + ``observation`` + the next generation prompt.

        Raises ``TokenMismatch`` when the new rendering does not extend the previous one. The
        renderings' ids are handled as ``kept prefix + new ids``, so a turn costs its own tokens,
        not the conversation's."""
        fmt = self.fmt
        prev = self._rendered
        n = len(prev)
        with_action = [*self._chat, *fmt.to_chat([action])]
        chat = [*with_action, *fmt.to_chat(observation)]
        closed_text = fmt.render_chat(with_action, add_generation_prompt=False)
        full_text = fmt.render_chat(chat, add_generation_prompt=True)
        # closed = prev[:kc] + c_ids, full = closed[:kf] + f_ids; kc <= n always
        kc, c_ids = fmt.extension(closed_text, self._text, prev)
        with memoryview(prev) as view, view[:kc] as kept:  # released before ``prev`` is resized
            kf, f_ids = fmt.extension(full_text, closed_text, kept, c_ids)
        n_closed = kc + len(c_ids)
        if n_closed < n or c_ids[: n - kc] != prev[kc:].tolist():
            _check_prefix(prev, array("i", [*prev[:kc], *c_ids]), "the conversation up to the assistant turn")
        closed_after_kf = [*prev[kf:kc], *c_ids[max(kf - kc, 0) :]]  # closed[kf:]
        if kf + len(f_ids) < n_closed or f_ids[: n_closed - kf] != closed_after_kf:
            closed = array("i", [*prev[:kc], *c_ids])
            _check_prefix(closed, array("i", [*closed[:kf], *f_ids]), "the conversation with the observation")
        tail = self._closing_tail()
        if c_ids[n - kc :] != self._last_gen + tail:
            self.retokenization_drift += 1
        delta = tail + f_ids[n_closed - kf :]
        start = len(self.token_ids)
        self.token_ids.extend(delta)
        self.loss_mask.extend(bytes(len(delta)))
        self.logprobs.extend(array("d", bytes(8 * len(delta))))
        self.messages = [*self.messages, action, *observation]
        self._chat = chat
        if kf < kc:  # full = prev[:kf] + f_ids
            del prev[kf:]
        else:  # full = prev[:kc] + c_ids[: kf - kc] + f_ids
            del prev[kc:]
            prev.extend(c_ids[: kf - kc])
        prev.extend(f_ids)
        self._text = full_text
        return start, len(self.token_ids)

    def _closing_tail(self) -> list[int]:
        """Closing ids of the assistant turn that were not sampled."""
        suffix = self.fmt.assistant_suffix_ids
        stops = self.fmt.stop_token_ids
        if self._last_gen and self._last_gen[-1] in stops:
            # the sampled stop token closes the turn; keep what the template writes after its own stop
            for i, t in enumerate(suffix):
                if t in stops:
                    return suffix[i + 1 :]
            return []
        return list(suffix)


def _check_prefix(prev: array, new: array, what: str) -> None:
    if new[: len(prev)] == prev:
        return
    at = next(
        (i for i, (a, b) in enumerate(zip(prev, new, strict=False)) if a != b), min(len(prev), len(new))
    )
    raise TokenMismatch(
        f"{what} does not extend the previous rendering: first difference at token {at} "
        f"(previous length {len(prev)}, new length {len(new)})"
    )


class _DirectTemplate:
    """The tokenizer's chat template rendered the way ``apply_chat_template`` renders it, minus its
    per-call overhead and with cheaper sandbox lookups (see ``_sandbox_getattr``): the same jinja
    sandbox, globals and filters (an overlay of transformers' own environment), the same variables.

    ``build`` returns None (callers then use ``apply_chat_template``) where transformers' compiled
    template is not reachable, where ``template_kwargs`` name one of ``apply_chat_template``'s own
    arguments, or where a probe conversation renders differently."""

    def __init__(self, template: Any, variables: dict[str, Any], tools: list[dict[str, Any]] | None):
        self.template = template
        # jinja merges the template's ChainMap of globals into a new dict on every render: done once here
        self.globals = dict(template.globals)
        self.variables = {**self.globals, **variables, "tools": tools, "documents": None}

    @classmethod
    def build(
        cls, tokenizer: Any, tools: list[dict[str, Any]] | None, template_kwargs: dict[str, Any]
    ) -> _DirectTemplate | None:
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template

            reserved = set(inspect.signature(tokenizer.apply_chat_template).parameters) | _RENDER_ARGS
            if reserved & set(template_kwargs):
                return None
            source = tokenizer.get_chat_template(None, tools)
            template = _compile_direct(_compile_jinja_template(source), source)
            direct = cls(template, {**tokenizer.special_tokens_map, **template_kwargs}, tools)
            for chat in _PROBES:
                for gen in (False, True):
                    reference = tokenizer.apply_chat_template(
                        chat, tools=tools, tokenize=False, add_generation_prompt=gen, **template_kwargs
                    )
                    if direct.render(chat, gen) != reference:
                        return None
        except Exception:  # noqa: BLE001 - any doubt: the reference path
            return None
        return direct

    def render(self, chat: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """``Template.render`` (same context, same precedence: variables over globals)."""
        from jinja2.runtime import new_context

        template = self.template
        env = template.environment
        variables = {**self.variables, "messages": chat, "add_generation_prompt": add_generation_prompt}
        context = new_context(env, template.name, template.blocks, variables, True, self.globals)
        try:
            return env.concat(template.root_render_func(context))
        except Exception:
            env.handle_exception()
            raise  # handle_exception re-raises; this line only tells type checkers


@functools.lru_cache(maxsize=64)
def _compile_direct(reference: Any, source: str) -> Any:
    """``source`` compiled in an overlay of the environment of transformers' ``reference`` template
    (same sandbox, globals, filters and extensions) with ``_sandbox_getattr``; compiled once."""
    env = reference.environment.overlay()
    env.getattr = _sandbox_getattr(env)
    return env.from_string(source)


_RENDER_ARGS = {"documents", "chat_template", "continue_final_message", "return_assistant_tokens_mask"}
_PROBES = (
    [{"role": "user", "content": "x"}],
    [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "t", "name": "f", "tool_call_id": "c"},
    ],
)
_DICT_ATTRIBUTES = frozenset(dir(dict))
_LOOP_COUNTERS = frozenset(
    {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0"}
)


def _sandbox_getattr(env: Any) -> Callable[[Any, str], Any]:
    """``env.getattr`` without its costly detours, same results: ``message.role`` on a plain dict is
    its key (the sandbox finds that only after a failed attribute lookup, with no safety check either
    way), and a loop counter (``loop.last``: an int or bool) is always safe."""
    from jinja2.runtime import LoopContext

    sandboxed = env.getattr

    def getattr_(obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                pass
        elif kind is LoopContext and attribute in _LOOP_COUNTERS:
            return getattr(obj, attribute)
        return sandboxed(obj, attribute)

    return getattr_


class PieceCache:
    """A thread-safe LRU map from text pieces to their ids, bounded by the pieces' total length.

    Values are read-only ``array``s; callers copy them (``list.extend``) and never hand them out."""

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.chars = 0
        self.hits = self.misses = 0
        self._items: OrderedDict[str, array] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, text: str) -> array | None:
        with self._lock:
            ids = self._items.get(text)
            if ids is None:
                self.misses += 1
            else:
                self.hits += 1
                self._items.move_to_end(text)
            return ids

    def put(self, text: str, ids: array) -> None:
        if len(text) > self.max_chars:
            return
        with self._lock:
            if text in self._items:
                return
            self._items[text] = ids
            self.chars += len(text)
            while self.chars > self.max_chars:
                old, _ = self._items.popitem(last=False)
                self.chars -= len(old)


_CODEC_STEPS = frozenset(
    {"__call__", "_call_one", "encode", "encode_plus", "_encode_plus", "_batch_encode_plus", "tokenize"}
    | {"prepare_for_tokenization", "decode", "_decode", "batch_decode", "convert_tokens_to_string"}
)


def _raw_tokenizer(tokenizer: Any) -> Any | None:
    """The Rust tokenizer behind a transformers fast tokenizer whose class changes none of the
    encode/decode steps of transformers' own fast-tokenizer base; None otherwise."""
    raw = getattr(tokenizer, "backend_tokenizer", None)
    mro = type(tokenizer).__mro__
    base = next(
        (i for i, c in enumerate(mro) if c.__name__ in ("TokenizersBackend", "PreTrainedTokenizerFast")), None
    )
    if raw is None or base is None or any(_CODEC_STEPS & set(vars(c)) for c in mro[:base]):
        return None
    return raw


def _split_anchors(tokenizer: Any) -> dict[int, str]:
    """Added tokens at which a text may be split and its pieces encoded separately
    (``ChatFormat.encode``, ``ChatFormat.encode_extending``).

    A fast tokenizer first cuts the raw text at its non-normalized added tokens (leftmost-longest),
    then normalizes, pre-tokenizes and encodes each piece on its own; so a text's ids are the
    concatenation of its pieces' ids. Anchors are those added tokens that strip no neighbouring
    whitespace and that no other added token contains or overlaps. None when the pieces are not independent: no fast tokenizer, special tokens split
    as text (``split_special_tokens``), a Metaspace pre-tokenizer (which prepends to the first piece
    only) or a ``single_word`` added token (which looks at its neighbours)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    added = getattr(tokenizer, "added_tokens_decoder", {})
    if (
        backend is None
        or "Metaspace" in repr(backend.pre_tokenizer)
        or getattr(tokenizer, "split_special_tokens", False)
        or any(tok.single_word for tok in added.values())
    ):
        return {}
    raw = {tok.content for tok in added.values() if not tok.normalized}
    return {
        tid: tok.content
        for tid, tok in added.items()
        if tok.content
        and not (tok.normalized or tok.lstrip or tok.rstrip)
        and not any(_overlap(tok.content, other) for other in raw if other != tok.content)
    }


def _overlap(a: str, b: str) -> bool:
    """Whether ``b`` contains ``a`` or the two can overlap (an end of one is a start of the other):
    then an occurrence of ``a`` in a text is not necessarily where the tokenizer cut it."""
    return a in b or any(b.endswith(a[:i]) or a.endswith(b[:i]) for i in range(1, min(len(a), len(b))))


def _added_token_pattern(tokenizer: Any) -> re.Pattern[str]:
    """Matches the added tokens the tokenizer cuts the raw text at, as it does: leftmost-longest."""
    contents = {tok.content for tok in tokenizer.added_tokens_decoder.values() if not tok.normalized}
    return re.compile("|".join(re.escape(c) for c in sorted(contents, key=len, reverse=True) if c))


def _stop_ids(tokenizer: Any) -> frozenset[int]:
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(tok) if tok in tokenizer.get_vocab() else None
        if isinstance(tid, int):
            ids.add(tid)
    return frozenset(ids)
