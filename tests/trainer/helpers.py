"""Builders of small hand-made trajectories for the credit tests."""

from turngym.core.types import Message, Trajectory, Turn


def make_traj(
    rewards,
    *,
    group="g",
    gen=3,
    obs=2,
    prompt=4,
    terminated=True,
    components=None,
    state_keys=None,
    reference=None,
    masked=False,
    infos=None,
):
    """A trajectory with len(rewards) turns and a token layout ``prompt | gen obs | gen obs | ... | gen``."""
    turns, ids, mask = [], [7] * prompt, [0] * prompt
    for k, r in enumerate(rewards):
        s = len(ids)
        ids += [1] * gen
        mask += [1] * gen
        last = k == len(rewards) - 1
        t = Turn(
            index=k,
            action=Message(role="assistant", content=f"act {k}"),
            observation=[Message(role="tool", content=f"obs {k}")],
            reward=r,
            reward_components=(components[k] if components else {}),
            state_key=state_keys[k] if state_keys else None,
            gen_span=(s, s + gen),
            terminated=terminated and last,
            info=dict(infos[k]) if infos else {},
        )
        if not last:
            t.obs_span = (len(ids), len(ids) + obs)
            ids += [2] * obs
            mask += [0] * obs
        turns.append(t)
    return Trajectory(
        group=group,
        prompt=[Message(role="user", content="q")],
        turns=turns,
        terminated=terminated,
        truncated=not terminated,
        token_ids=ids,
        loss_mask=mask,
        logprobs=[0.0] * len(ids),
        reference=reference or {},
        masked=masked,
    )
