"""Episodes: the calls of one harness run, their token sequences, their reward, their trajectory.

An ``Episode`` collects the calls made under one episode key (``segments``: each call continues the
last sequence or starts a new one, with the drift recorded). It ends when the harness (or the
harness runner) says so, or after ``idle_timeout_s`` without a call; then its reward comes from a
posted reward, else the user's ``reward_fn`` over the trajectory; an episode with neither by
``reward_timeout_s`` after its end is masked with the reason. A finished episode is a turngym
``Trajectory`` (one turn per call), appended to ``<out>/trajectories.jsonl`` (``turngym view``).

Trajectory layout: ``token_ids``/``loss_mask``/``logprobs`` are the segments one after the other;
``metadata["segments"]`` holds their ``[start, end)`` spans and ``metadata["drifts"]`` why and where
each new segment began (``split_segments`` gives one trajectory per segment for trainers that need
one sequence per sample). Each turn's ``gen_span``/``obs_span`` index the whole sequence;
``info["segment"]`` names its segment. The reward lands on the last turn (outcome) unless env steps
paid per turn; an episode whose harness reset an env through the proxy's MCP door and ended
before the env did has the env's return so far (``truncated``). ``timing`` per turn: ``queued``
(waiting behind the episode's previous call), ``generate`` (the backend), ``harness`` (the harness's
time since the previous reply).
"""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from turngym.core.types import Message, Trajectory, Turn
from turngym.proxy.segments import Candidate, Drift
from turngym.proxy.wire import ProxyError

RewardFn = Callable[[Trajectory], "float | tuple[float, dict[str, float]] | Awaitable[Any]"]
_KEY = re.compile(r"[A-Za-z0-9_.:@-]{1,128}")


def check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ProxyError(400, "an episode key is 1-128 characters of [A-Za-z0-9_.:@-]", param="episode")
    return key


@dataclass
class CallRecord:
    """One call of an episode (a turn of its trajectory)."""

    index: int
    segment: int
    action: Message
    gen_span: tuple[int, int]  # within the segment
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str
    n: int = 1
    error: str = ""
    drift: Drift | None = None
    timing: dict[str, float] = field(default_factory=dict)
    observation: list[Message] = field(default_factory=list)
    obs_span: tuple[int, int] | None = None
    chosen: int = 0
    started: float = 0.0  # time.monotonic() when the call arrived


@dataclass
class Episode:
    key: str
    task_id: str = ""
    group: str = ""
    sample: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.monotonic)
    last_call: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    calls: list[CallRecord] = field(default_factory=list)
    prompt: list[Message] = field(default_factory=list)
    closed: list[Any] = field(default_factory=list)  # finished segments' token sequences
    current: list[Candidate] | None = None  # the last call's candidates
    current_fmt: Any = None
    reprefill_tokens: int = 0
    reward: float | None = None
    components: dict[str, float] = field(default_factory=dict)
    env_steps: list[dict[str, Any]] = field(default_factory=list)
    ended_at: float | None = None
    end_reason: str = ""
    mask_reason: str = ""
    trajectory: Trajectory | None = None
    routes: set[str] = field(default_factory=set)  # the backend routes its calls used
    known: Any = None  # its last chat request's messages (``turngym.proxy.wire.KnownMessages``)

    @property
    def finished(self) -> bool:
        return self.trajectory is not None

    @property
    def segments(self) -> int:
        return len(self.closed) + (1 if self.current else 0)

    def commit(self, plan: Any, candidates: list[Candidate], record: CallRecord, fmt: Any) -> None:
        """Record a successful call planned by ``plan`` (``turngym.proxy.segments``)."""
        if plan.continued:
            last = self.calls[-1]
            last.chosen, last.observation, last.obs_span = plan.chosen, plan.observation, plan.obs_span
        else:
            if self.current:
                self.closed.append(self.current[0].tokens)
                self.reprefill_tokens += candidates[0].gen_span[0]
            if not self.calls:
                self.prompt = list(getattr(plan.tokens, "messages", []))
        record.segment = len(self.closed)
        self.calls.append(record)
        self.current, self.current_fmt = candidates, fmt
        self.last_call = time.monotonic()

    def to_trajectory(self, *, env_id: str, model: str) -> Trajectory:
        final = self.calls[-1].chosen if self.calls else 0
        seqs = [*self.closed, *([self.current[final].tokens] if self.current else [])]
        offsets, ids, mask, lps, spans = [], [], [], [], []
        for seq in seqs:
            offsets.append(len(ids))
            spans.append([len(ids), len(ids) + len(seq.token_ids)])
            ids += seq.token_ids.tolist()
            mask += seq.loss_mask.tolist()
            lps += seq.logprobs.tolist()
        traj = Trajectory(
            env_id=env_id,
            task_id=self.task_id,
            group=self.group,
            sample=self.sample,
            prompt=self.prompt,
            token_ids=ids,
            loss_mask=mask,
            logprobs=lps,
            prompt_len=seqs[0].prompt_len if seqs else 0,
        )
        for rec in self.calls:
            off = offsets[rec.segment] if rec.segment < len(offsets) else 0
            turn = Turn(
                index=rec.index,
                action=rec.action,
                observation=rec.observation,
                gen_span=(rec.gen_span[0] + off, rec.gen_span[1] + off),
                obs_span=None if rec.obs_span is None else (rec.obs_span[0] + off, rec.obs_span[1] + off),
                finish_reason=rec.finish_reason,
                invalid_action=bool(rec.error),
                error=rec.error,
                timing=rec.timing,
                info={
                    "segment": rec.segment,
                    "prompt_tokens": rec.prompt_tokens,
                    "completion_tokens": rec.completion_tokens,
                    **({"n": rec.n, "chosen": rec.chosen} if rec.n > 1 else {}),
                    **({"drift": rec.drift.to_dict()} if rec.drift else {}),
                },
            )
            traj.turns.append(turn)
        self._apply_rewards(traj)
        drifts = [rec.drift.to_dict() | {"call": rec.index} for rec in self.calls if rec.drift]
        traj.metrics.update(
            calls=float(len(self.calls)),
            segments=float(len(seqs)),
            drift=float(len(drifts)),
            reprefill_tokens=float(self.reprefill_tokens),
            retokenization_drift=float(sum(s.retokenization_drift for s in seqs)),
            generated_tokens=float(sum(r.completion_tokens for r in self.calls)),
        )
        traj.metadata.update(
            self.metadata, episode=self.key, model=model, segments=spans, drifts=drifts, end=self.end_reason
        )
        traj.terminated = bool(self.calls)
        if "env_task" in self.metadata:  # the env's own ending: a harness that quits early truncates it
            traj.terminated = any(s["terminated"] for s in self.env_steps)
            traj.truncated = not traj.terminated
        if self.mask_reason:
            traj.masked, traj.mask_reason = True, self.mask_reason
        elif not self.calls:
            traj.masked, traj.mask_reason = True, "no_calls: the harness made no model call"
        return traj

    def _apply_rewards(self, traj: Trajectory) -> None:
        """Env steps pay the turn of the latest call before them; a posted reward pays the last turn."""
        if not traj.turns:
            return
        starts = [rec.started for rec in self.calls]
        for step in self.env_steps:
            k = max((i for i, t in enumerate(starts) if t <= step["t"]), default=0)
            turn = traj.turns[k]
            turn.reward += float(step["reward"])
            for name, value in (step.get("components") or {}).items():
                turn.reward_components[name] = turn.reward_components.get(name, 0.0) + float(value)
        if self.reward is not None and not self.env_steps:
            traj.turns[-1].reward = float(self.reward)
            traj.turns[-1].reward_components = dict(self.components)


class EpisodeStore:
    """Live and finished episodes; ends idle ones and masks those whose reward never comes."""

    def __init__(
        self,
        *,
        env_id: str = "proxy",
        model: str = "",
        writer: Any = None,
        reward_fn: RewardFn | None = None,
        reward_timeout_s: float = 60.0,
        idle_timeout_s: float = 600.0,
        max_live: int = 4096,
    ):
        self.env_id, self.model = env_id, model
        self.writer = writer
        self.reward_fn = reward_fn
        self.reward_timeout_s = reward_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_live = max_live
        self.live: dict[str, Episode] = {}
        self.finished: dict[str, Trajectory] = {}
        self.on_finish: list[Callable[[Episode], None]] = []  # e.g. free the episode's KV cache

    def open(self, key: str, **fields: Any) -> Episode:
        """The live episode ``key`` (made on first use with ``fields``); 409 if it has finished."""
        check_key(key)
        if key in self.finished:
            raise ProxyError(409, f"episode {key!r} has finished", param="episode", code="episode_finished")
        ep = self.live.get(key)
        if ep is None:
            if len(self.live) >= self.max_live:
                raise ProxyError(503, f"{self.max_live} episodes are live; end some first", code="too_many")
            ep = self.live[key] = Episode(key, **fields)
        return ep

    def get(self, key: str) -> Episode | Trajectory:
        check_key(key)
        if key in self.live:
            return self.live[key]
        if key in self.finished:
            return self.finished[key]
        raise ProxyError(404, f"no episode {key!r}", param="episode", code="episode_not_found")

    def _live(self, key: str) -> Episode:
        got = self.get(key)
        if not isinstance(got, Episode):
            raise ProxyError(409, f"episode {key!r} has finished", param="episode", code="episode_finished")
        return got

    async def set_reward(
        self, key: str, reward: float, components: dict[str, float] | None = None, *, end: bool = True
    ) -> Episode:
        ep = self.open(key)
        ep.reward, ep.components = float(reward), dict(components or {})
        if end:
            await self.end(key, "reward")
        return ep

    def add_env_step(self, key: str, reward: float, components: dict[str, float], terminated: bool) -> None:
        """An env step of this episode (the harness's tool call through ``serve --mcp``)."""
        ep = self.open(key)
        ep.env_steps.append(
            {"t": time.monotonic(), "reward": reward, "components": components, "terminated": terminated}
        )
        ep.reward = sum(s["reward"] for s in ep.env_steps)

    async def end(self, key: str, reason: str = "ended", *, mask: str = "") -> Episode:
        """No more calls; finish now if the reward is known (or the reward function gives it), or
        masked with ``mask`` (the reason) if given."""
        ep = self._live(key)
        if ep.ended_at is None:
            ep.ended_at, ep.end_reason = time.monotonic(), reason
        if ep.reward is None and "env_task" in ep.metadata:  # the env was reset: its return so far
            ep.reward = sum(s["reward"] for s in ep.env_steps)
        if mask:
            await self.finish(ep, mask)
        elif ep.reward is not None or self.reward_fn is not None or not ep.calls:
            await self.finish(ep)
        return ep

    async def finish(self, ep: Episode, mask_reason: str = "") -> Trajectory:
        if ep.trajectory is not None:
            return ep.trajectory
        if mask_reason and not ep.mask_reason:
            ep.mask_reason = mask_reason
        if ep.ended_at is None:
            ep.ended_at = time.monotonic()
        traj = ep.to_trajectory(env_id=self.env_id, model=self.model)
        if ep.reward is None and self.reward_fn is not None and ep.calls and not ep.mask_reason:
            try:
                value = self.reward_fn(traj)
                if inspect.isawaitable(value):
                    value = await value
                reward, comps = value if isinstance(value, tuple) else (value, {})
                ep.reward, ep.components = float(reward), dict(comps)
            except Exception as e:  # noqa: BLE001 - a user function's fault masks the episode, with why
                ep.mask_reason = f"reward_fn_failed: {type(e).__name__}: {e}"
            traj = ep.to_trajectory(env_id=self.env_id, model=self.model)
        ep.trajectory = traj
        self.live.pop(ep.key, None)
        self.finished[ep.key] = traj
        if self.writer is not None:
            self.writer.write(traj)
        for hook in self.on_finish:
            hook(ep)
        return traj

    async def sweep(self, now: float | None = None) -> list[str]:
        """End idle episodes; mask ended ones whose reward did not come in time. Returns finished keys."""
        now = time.monotonic() if now is None else now
        done = []
        for ep in list(self.live.values()):
            if ep.lock.locked():
                continue
            if ep.ended_at is None and now - ep.last_call > self.idle_timeout_s:
                await self.end(ep.key, "idle")
            if ep.ended_at is not None and not ep.finished and now - ep.ended_at >= self.reward_timeout_s:
                await self.finish(
                    ep, f"no_reward: no reward within {self.reward_timeout_s:g}s of the episode's end"
                )
            if ep.finished:
                done.append(ep.key)
        return done


def split_segments(traj: Trajectory) -> list[Trajectory]:
    """One trajectory per segment (its tokens, its turns, spans rebased; the reward stays on its turns)."""
    spans = traj.metadata.get("segments") or [[0, len(traj.token_ids)]]
    out = []
    for k, (start, end) in enumerate(spans):
        part = traj.model_copy(deep=True)
        part.token_ids = traj.token_ids[start:end]
        part.loss_mask = traj.loss_mask[start:end]
        part.logprobs = traj.logprobs[start:end]
        part.turns = []
        for turn in traj.turns:
            if turn.info.get("segment") != k:
                continue
            t = turn.model_copy(deep=True)
            t.gen_span = None if t.gen_span is None else (t.gen_span[0] - start, t.gen_span[1] - start)
            t.obs_span = None if t.obs_span is None else (t.obs_span[0] - start, t.obs_span[1] - start)
            part.turns.append(t)
        part.prompt_len = part.turns[0].gen_span[0] if part.turns and part.turns[0].gen_span else 0
        part.metadata = {**traj.metadata, "segment": k}
        out.append(part)
    return out
