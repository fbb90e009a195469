"""How the ranks' step metrics become one row (``turngym.trainer.distributed.merge_metrics``): a
prefix in ``summed`` adds up over the ranks, one in ``maxed`` takes the largest rank (memory must fit
on every card), every other key is the mean of the ranks that report it. The ranks' rows come from a
context whose gather hands back given rows (the gather itself runs over gloo in tests/scale)."""

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from turngym.trainer.distributed import DistContext, merge_metrics


@dataclass(frozen=True)
class Gathered(DistContext):
    rows: tuple = ()

    def all_gather(self, obj):
        return [obj, *self.rows]


KEYS = ["rollout/generated_tokens", "memory/update_peak_gib", "update/loss", "time/step"]
VALUES = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
ROW = st.dictionaries(st.sampled_from(KEYS), VALUES)


@given(st.lists(ROW, min_size=2, max_size=5))
def test_summed_maxed_and_averaged_keys(rows):
    ctx = Gathered(rank=0, world_size=len(rows), rows=tuple(rows[1:]))
    merged = merge_metrics(ctx, rows[0], summed=("rollout/",), maxed=("memory/",))
    assert set(merged) == {k for r in rows for k in r}
    for k, v in merged.items():
        seen = [r[k] for r in rows if k in r]
        want = (
            sum(seen)
            if k.startswith("rollout/")
            else max(seen)
            if k.startswith("memory/")
            else sum(seen) / len(seen)
        )
        assert abs(v - want) <= 1e-9 * max(1.0, *map(abs, seen)), (k, seen, v)


def test_one_process_returns_its_own_row():
    row = {"memory/update_peak_gib": 3.0, "time/step": 1.0}
    assert merge_metrics(DistContext(), row, maxed=("memory/",)) == row
