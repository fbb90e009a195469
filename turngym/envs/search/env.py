"""``search-qa``: answer a multi-hop question by searching a passage corpus.

Tools: ``search(query, k=3)`` returns the top-k passages as ``Doc i (Title: ...) text``;
``answer(text)`` ends the episode. With ``parser="tags"`` the agent uses Search-R1's protocol
instead (``<search>q</search>`` -> ``<information>...</information>``, ``<answer>a</answer>``)
and sees Search-R1's prompt, so published checkpoints run unchanged.

Reward (paid on the last turn): ``reward = <em or f1> + format``. ``reward_components`` holds
``em`` and ``f1`` (both always reported, SQuAD-normalised, best over the gold alternatives) and
``format`` (``-format_penalty`` when the episode ended without an answer, else 0); only the
metric chosen by ``reward=`` enters the sum, so the components do not add up to the reward.

Data: by default a generated world of ``n_passages`` passages and ``n_tasks`` questions (``mix``:
"default" = bridge 2-4 hops + comparison, "easy" = mostly 1-2 hops, "hard" = 3-4 hops, "sparse" =
bridge 3-5 hops only), cached on disk (``turngym.make("search-qa")`` is quick after the first call);
or ``corpus=`` (JSONL) plus ``tasks=`` (FlashRAG JSONL, Search-R1 parquet, HotpotQA JSON — HotpotQA brings its own
corpus — as a file, a directory, a glob or a list of files, read through ``datasets`` where it
takes more than one plain file; or a ``datasets.Dataset``); or ``retriever="http://host:port"`` for a ``/retrieve`` server (one batching client per
URL per process, so concurrent envs' searches travel together).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import numpy as np

from turngym.core.env import Task, pick_task_index
from turngym.core.types import Message, ToolCall, ToolResult
from turngym.envs.search.corpus import Corpus
from turngym.envs.search.data import load_corpus, load_task_file, select_tasks, synthetic_dataset
from turngym.envs.search.metrics import best_exact_match, best_f1
from turngym.envs.search.retriever import Doc, Retriever, RetrieverError, shared_bm25
from turngym.envs.search.server import shared_remote
from turngym.envs.search.tasks import QATask
from turngym.tools import ToolError, tool
from turngym.tools.env import Env
from turngym.tools.parsers import ToolCallParser, get_parser

SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time "
    "you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between "
    "<information> and </information>. You can search as many times as your want. If you find no further "
    "external knowledge needed, you can directly provide the answer inside <answer> and </answer>, "
    "without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

SYSTEM_PROMPT = (
    "You answer questions by searching a corpus of passages. Each search returns the best-matching "
    "passages; facts about one entity often lead to the next search. Search as often as you need, "
    "then call answer with a short answer (a name, place, number or year), not a sentence."
)

NOISE_POOL = 20  # how deep in the ranking simulated noisy passages are drawn from


def format_docs(docs: list[Doc]) -> str:
    """Search-R1's passage rendering: ``Doc 1 (Title: X) text`` one per line."""
    if not docs:
        return "No passages match the query."
    return "\n".join(f"Doc {i} (Title: {d.title}) {d.contents}" for i, d in enumerate(docs, 1))


class SearchQAEnv(Env):
    """Multi-hop QA over a local (or remote) BM25 index with ``search`` and ``answer`` tools."""

    default_max_turns = 6
    forkable = True
    #: shared with forks, never copied: the passage store, the task list and its index, the BM25 index (or
    #: remote client), and the current task (an element of ``tasks``); none of them changes in an episode
    _fork_shared = ("corpus", "tasks", "_task_index", "retriever", "current")

    def __init__(
        self,
        corpus: str | os.PathLike[str] | Corpus | None = None,
        tasks: str | os.PathLike[str] | list[QATask] | list[str | os.PathLike[str]] | Any | None = None,
        *,
        task_format: str | None = None,
        n_passages: int = 10_000,
        n_tasks: int = 2_000,
        world_seed: int = 0,
        mix: str = "default",
        split: Literal["train", "test"] | None = None,
        kinds: list[str] | None = None,
        hops: list[int] | None = None,
        retriever: str | Retriever | None = None,
        reward: Literal["em", "f1"] = "em",
        format_penalty: float = 0.1,
        noise_prob: float = 0.0,
        max_k: int = 10,
        max_query_chars: int = 500,
        cache_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ):
        if reward not in ("em", "f1"):
            raise ValueError(f"reward must be 'em' or 'f1', got {reward!r}")
        if not 0.0 <= noise_prob <= 1.0:
            raise ValueError(f"noise_prob must be in [0, 1], got {noise_prob}")
        if max_k < 1 or max_query_chars < 1:
            raise ValueError("max_k and max_query_chars must be >= 1")
        if isinstance(retriever, str) and not retriever.startswith(("http://", "https://")):
            raise ValueError(f"retriever must be an http(s) URL of a /retrieve server, got {retriever!r}")
        if split not in (None, "train", "test"):
            raise ValueError(f"split must be 'train', 'test' or None, got {split!r}")
        super().__init__(**kwargs)
        self.reward_metric = reward
        self.format_penalty = float(format_penalty)
        self.noise_prob = float(noise_prob)
        self.max_k = max_k
        self.max_query_chars = max_query_chars

        self.corpus, all_tasks = self._load_data(
            corpus, tasks, task_format, n_passages, n_tasks, world_seed, mix, cache_dir, retriever
        )
        self.tasks, self._task_index = select_tasks(all_tasks, split, kinds, hops)
        if not self.tasks:
            raise ValueError(f"no tasks left after filtering (split={split}, kinds={kinds}, hops={hops})")
        if isinstance(retriever, str):
            self.retriever: Retriever = shared_remote(retriever)
        elif retriever is not None:
            self.retriever = retriever
        else:
            assert self.corpus is not None
            self.retriever = shared_bm25(self.corpus, cache_dir=cache_dir)

        self.current: QATask | None = None
        self._answer: str | None = None
        self._retrieved: set[str] = set()
        self._queries: list[str] = []
        self._episode_noise = self.noise_prob

    @staticmethod
    def _load_data(corpus, tasks, task_format, n_passages, n_tasks, world_seed, mix, cache_dir, retriever):
        if tasks is None:
            if corpus is not None:
                raise ValueError("a corpus was given without tasks: pass tasks= (a task file or list)")
            return synthetic_dataset(n_passages, n_tasks, seed=world_seed, cache_dir=cache_dir, mix=mix)
        context_corpus = None
        if isinstance(tasks, list) and all(isinstance(t, QATask) for t in tasks):
            task_list = tasks
        else:  # a file, a directory, a glob, a list of files or a datasets.Dataset
            task_list, context_corpus = load_task_file(tasks, task_format, cache_dir)
        if isinstance(corpus, Corpus):
            return corpus, task_list
        if corpus is not None:
            return load_corpus(corpus), task_list
        if context_corpus is not None or retriever is not None:
            return context_corpus, task_list
        raise ValueError(f"tasks from {tasks!r} need a corpus: pass corpus=<file.jsonl> or retriever=<url>")

    # ------------------------------------------------------------------ tools
    @tool
    def search(self, query: str, k: int = 3) -> str:
        """Search the corpus; returns the top k passages as 'Doc i (Title: ...) text'.

        Args:
            query: keywords to search for, e.g. an entity name and the fact you need
            k: how many passages to return
        """
        query = query.strip()
        if not query:
            raise ToolError("the query is empty: search for keywords, e.g. a name and the fact you need")
        if len(query) > self.max_query_chars:
            raise ToolError(f"the query has {len(query)} characters; the limit is {self.max_query_chars}")
        if not 1 <= k <= self.max_k:
            raise ToolError(f"k must be between 1 and {self.max_k}, got {k}")
        noisy = self._episode_noise > 0 and self.np_random.random() < self._episode_noise
        try:
            docs = self.retriever.retrieve([query], k + NOISE_POOL if noisy else k)[0]
        except RetrieverError as e:
            raise ToolError(f"search failed: {e}") from e
        if noisy:
            docs = self._noisy(docs, k)
        self._queries.append(query)
        self._retrieved.update(d.id for d in docs)
        return format_docs(docs)

    @tool(terminal=True)
    def answer(self, text: str) -> str:
        """Give the final answer; ends the episode.

        Args:
            text: the answer, as short as possible (a name, place, number or year)
        """
        self._answer = text.strip()[:10_000]
        return "Answer submitted."

    def _noisy(self, ranked: list[Doc], k: int) -> list[Doc]:
        """ZeroSearch-style noise: plausible passages from deeper in the ranking, never a supporting one."""
        gold = set(self.current.supporting_ids) if self.current else set()
        pool = [d for d in ranked[k:] if d.id not in gold]
        if len(pool) < k and self.corpus is not None:
            extra = self.np_random.choice(len(self.corpus), size=min(len(self.corpus), 4 * k), replace=False)
            c = self.corpus
            seen = gold | {d.id for d in ranked}
            pool += [Doc(c.ids[i], c.titles[i], c.contents[i]) for i in extra if c.ids[i] not in seen]
        picks = self.np_random.choice(len(pool), size=min(k, len(pool)), replace=False) if pool else []
        return [pool[int(i)] for i in picks]

    # ------------------------------------------------------------------ hooks
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> Task:
        index = pick_task_index(options, self._task_index, len(self.tasks), rng)
        self.current = task = self.tasks[index]
        self._answer = None
        self._retrieved = set()
        self._queries = []
        self._episode_noise = float(options.get("noise_prob", self.noise_prob))
        if self.parser.name == "tags":
            messages = [Message(role="user", content=SEARCH_R1_PROMPT.format(question=task.question))]
        else:
            system = f"{SYSTEM_PROMPT}\n\n{self.tool_instructions()}".strip()
            messages = [
                Message(role="system", content=system),
                Message(role="user", content=f"Question: {task.question}"),
            ]
        return Task(
            messages=messages,
            task_id=task.id,
            reference=task.reference(),
            info={"kind": task.kind, "hops": task.hops},
        )

    def _turn_reward(self, results: list[ToolResult], done: bool) -> dict[str, float]:
        if not done:
            return {}
        assert self.current is not None
        if self._answer is None:
            return {"em": 0.0, "f1": 0.0, "format": -self.format_penalty}
        return {
            "em": best_exact_match(self._answer, self.current.answers),
            "f1": best_f1(self._answer, self.current.answers),
            "format": 0.0,
        }

    def _reward(self, components: dict[str, float]) -> float:
        """Only the chosen metric (plus the format penalty) is paid; see the module docstring."""
        return components[self.reward_metric] + components["format"] if components else 0.0

    def _state_key(self) -> str:
        task_id = self.current.id if self.current else ""
        return f"{task_id}|{','.join(sorted(self._retrieved))}"

    # ------------------------------------------------------------- experts
    def expert_action(self) -> str | Message | None:
        """Follow the gold trace: search each hop's query whose passage is not yet retrieved, then answer.

        Tasks without a trace (loaded data sets) get one search for the question itself.
        """
        task = self.current
        if task is None or self._done:
            return None
        trace = list(zip(task.gold_trace, task.supporting_ids, strict=True)) or [(task.question, "")]
        for query, pid in trace:
            if (not pid or pid not in self._retrieved) and query not in self._queries:
                return format_call(self.parser, "search", {"query": query})
        return format_call(self.parser, "answer", {"text": task.answers[0]})

    @property
    def last_answer(self) -> str | None:
        return self._answer


def format_call(parser: str | ToolCallParser, name: str, arguments: dict[str, Any]) -> str | Message:
    """One tool call as the model would write it for ``parser`` (its ``format_call``)."""
    return get_parser(parser).format_call(ToolCall(name=name, arguments=arguments))
