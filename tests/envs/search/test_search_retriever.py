"""Corpus JSONL and the bm25s retriever: formats, on-disk cache, batching, agreement with bm25s."""

from __future__ import annotations

import json

import bm25s
import numpy as np
import pytest

from turngym.envs.search.corpus import Corpus, CorpusError
from turngym.envs.search.retriever import BM25Retriever, RetrieverError, shared_bm25

RECORDS = [
    {"id": "a", "title": "Porvik", "contents": "Porvik is a city in Veloria. It has a harbour."},
    {"id": "b", "title": "Veloria", "contents": "The capital of Veloria is Porvik."},
    {"id": "c", "title": "Halvor Brenn", "contents": "Halvor Brenn was born in Porvik in 1950."},
    {"id": "d", "title": "Halvor Brenna", "contents": "Halvor Brenna was born in Tessa in 1961."},
]


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_jsonl_round_trip_and_wiki18_titles(tmp_path):
    corpus = Corpus.from_records(RECORDS)
    out = corpus.to_jsonl(tmp_path / "c.jsonl")
    again = Corpus.from_jsonl(out)
    assert list(again) == list(corpus) and again.fingerprint == corpus.fingerprint
    wiki = write_jsonl(tmp_path / "w.jsonl", [{"id": 7, "contents": '"Porvik"\nA harbour city.'}])
    p = Corpus.from_jsonl(wiki)[0]
    assert (p.id, p.title, p.contents) == ("7", "Porvik", "A harbour city.")
    assert Corpus.from_records([{"id": 1, "contents": "no title line"}])[0].title == ""


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"id": 1, "contents": "x"}', "{oops"], ":2: not valid JSON"),
        (['{"id": 1}'], "needs 'id' and 'contents'"),
        (['{"id": 1, "contents": 5}'], "'contents' must be a string"),
        (['{"id": 1, "contents": "x"}', '{"id": 1, "contents": "y"}'], "duplicate passage id '1'"),
        (["[1, 2]"], "not an object"),
    ],
)
def test_bad_corpus_files_name_the_problem(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(CorpusError, match=message.replace("(", r"\(")):
        Corpus.from_jsonl(path)
    with pytest.raises(CorpusError, match="not found"):
        Corpus.from_jsonl(tmp_path / "missing.jsonl")


def test_retrieve_ranks_the_exact_name_first():
    r = BM25Retriever(Corpus.from_records(RECORDS), use_cache=False)
    [top] = r.retrieve(["Halvor Brenna born"], k=2)
    assert [d.id for d in top] == ["d", "c"]
    assert top[0].score > top[1].score > 0
    assert top[0].title == "Halvor Brenna" and "Tessa" in top[0].contents


def test_no_match_empty_query_and_bad_arguments():
    r = BM25Retriever(Corpus.from_records(RECORDS), use_cache=False)
    assert r.retrieve(["zzzz qqqq", "", "the of and"], k=3) == [[], [], []]
    assert len(r.retrieve(["porvik"], k=100)[0]) == 3  # only passages that match at all
    for bad in (0, -1, 2.5, True):
        with pytest.raises(RetrieverError, match="k must be a positive integer"):
            r.retrieve(["porvik"], k=bad)
    with pytest.raises(RetrieverError, match="list of strings"):
        r.retrieve("porvik", k=1)
    with pytest.raises(RetrieverError, match="must be a string"):
        r.retrieve([42], k=1)
    with pytest.raises(RetrieverError, match="empty corpus"):
        BM25Retriever(Corpus([], [], []), use_cache=False)


def test_batch_equals_single_queries_and_matches_bm25s(world, retriever, questions):
    queries = [q for t in questions[:40] for q in t.gold_trace]
    batch = retriever.retrieve(queries, k=5)
    assert batch == [retriever.retrieve([q], k=5)[0] for q in queries]
    # the fast path scores exactly like bm25s's own retrieve() over the same tokens
    model = bm25s.BM25()
    model.index(
        [retriever.tokenize(world.corpus.text(i)) for i in range(len(world.corpus))], show_progress=False
    )
    tokens = [retriever.tokenize(q) for q in queries]
    _, scores = model.retrieve(tokens, k=5, show_progress=False)
    ours = np.array([[d.score for d in docs] for docs in batch])
    np.testing.assert_allclose(ours, scores, rtol=1e-5)


def test_index_is_cached_on_disk_and_reused(tmp_path):
    corpus = Corpus.from_records(RECORDS)
    first = BM25Retriever(corpus, cache_dir=tmp_path)
    assert not first.loaded_from_cache and (first.index_dir / "done").is_file()
    assert first.index_dir.is_relative_to(tmp_path / "search" / "bm25")
    second = BM25Retriever(Corpus.from_records(RECORDS), cache_dir=tmp_path)
    assert second.loaded_from_cache and second.index_dir == first.index_dir
    assert second.retrieve(["Porvik capital"], 4) == first.retrieve(["Porvik capital"], 4)
    changed = Corpus.from_records([*RECORDS, {"id": "e", "title": "New", "contents": "new text"}])
    third = BM25Retriever(changed, cache_dir=tmp_path)
    assert not third.loaded_from_cache and third.index_dir != first.index_dir


def test_damaged_cache_is_rebuilt(tmp_path):
    corpus = Corpus.from_records(RECORDS)
    index_dir = BM25Retriever(corpus, cache_dir=tmp_path).index_dir
    for f in index_dir.glob("*.npy"):
        f.write_bytes(b"garbage")
    again = BM25Retriever(corpus, cache_dir=tmp_path)
    assert not again.loaded_from_cache
    assert [d.id for d in again.retrieve(["Halvor Brenn 1950"], 1)[0]] == ["c"]
    assert BM25Retriever(corpus, cache_dir=tmp_path).loaded_from_cache  # the rebuilt index was saved


def test_shared_index_per_process(tmp_path):
    corpus = Corpus.from_records(RECORDS)
    assert shared_bm25(corpus, tmp_path) is shared_bm25(Corpus.from_records(RECORDS), tmp_path)


def test_concurrent_builders_share_one_cache_entry(tmp_path, world):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        built = list(pool.map(lambda _: BM25Retriever(world.corpus, cache_dir=tmp_path), range(3)))
    entries = [p for p in (tmp_path / "search" / "bm25").iterdir()]
    assert len(entries) == 1 and (entries[0] / "done").is_file()  # no temp folders left behind
    want = built[0].retrieve(["mayor"], 3)
    assert all(r.retrieve(["mayor"], 3) == want for r in built)
    assert BM25Retriever(world.corpus, cache_dir=tmp_path).retrieve(["mayor"], 3) == want


def test_bm25s_import_never_starts_jax(tmp_path):
    """bm25s runs a jax top-k at import time when jax is installed, which would grab the GPU of a
    training process; turngym's import hides jax (and numba) so neither is even imported."""
    import subprocess
    import sys
    import textwrap

    for name in ("jax", "numba"):  # stand-ins that leave a mark when imported
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text(f"open({str(tmp_path / (name + '.imported'))!r}, 'w').close()\n")
        (pkg / "lax.py").write_text("def top_k(x, k):\n    raise RuntimeError('jax ran')\n")
    code = textwrap.dedent(
        """
        import sys
        from turngym.envs.search.retriever import import_bm25s
        import_bm25s()
        import bm25s.selection
        assert not bm25s.selection.JAX_IS_AVAILABLE
        print(sorted(m for m in ("jax", "numba") if m in sys.modules))
        """
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert not (tmp_path / "jax.imported").exists() and not (tmp_path / "numba.imported").exists()


def test_bm25s_import_from_many_threads_at_once_gives_every_thread_the_whole_module():
    """Envs are built in worker threads: the first import must not hand out a half-built module."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import threading
        from turngym.envs.search.retriever import import_bm25s
        errors = []
        def go():
            try:
                assert import_bm25s().__version__
            except Exception as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=go) for _ in range(8)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        print(errors)
        """
    )
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "[]"
