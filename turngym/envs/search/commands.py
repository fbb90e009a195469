"""``turngym search ...``: generate a world, build an index, serve or query a retriever.

``app`` is a typer group (attach with ``add_typer(app, name="search")``); the functions are
plain typer commands too. Heavy imports happen inside the functions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="search-qa: synthetic worlds, BM25 indexes and the /retrieve server.", no_args_is_help=True
)


@app.command("generate")
def search_generate(
    out: Annotated[Path, typer.Argument(help="Folder for corpus.jsonl and tasks.jsonl.")],
    passages: Annotated[int, typer.Option(help="Passages in the corpus (>= 100).")] = 10_000,
    questions: Annotated[int, typer.Option(help="Questions to generate.")] = 2_000,
    seed: Annotated[int, typer.Option(help="World and question seed.")] = 0,
) -> None:
    """Generate a synthetic world: corpus.jsonl ({id,title,contents}) and tasks.jsonl (FlashRAG format)."""
    import time

    from turngym.envs.search.questions import generate_questions
    from turngym.envs.search.tasks import write_tasks
    from turngym.envs.search.world import World, WorldConfig

    start = time.perf_counter()
    world = World.generate(WorldConfig(seed=seed, n_passages=passages))
    tasks = generate_questions(world, questions, seed=seed)
    world.corpus.to_jsonl(out / "corpus.jsonl")
    write_tasks(tasks, out / "tasks.jsonl")
    typer.echo(
        f"{len(world.corpus)} passages, {len(tasks)} questions -> {out} ({time.perf_counter() - start:.1f}s)"
    )


@app.command("index")
def search_index(
    corpus: Annotated[
        Path, typer.Argument(help="Corpus JSONL ({id,title,contents} or wiki-18 {id,contents}).")
    ],
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder (default: ~/.cache/turngym).")] = None,
) -> None:
    """Build (or find) the cached BM25 index of a corpus."""
    from turngym.envs.search.retriever import BM25Retriever

    r = BM25Retriever.from_jsonl(corpus, cache_dir=cache_dir)
    how = "loaded from cache" if r.loaded_from_cache else f"built in {r.build_seconds:.1f}s"
    typer.echo(f"{len(r.corpus)} passages, index {how}: {r.index_dir}")


@app.command("serve")
def search_serve(
    corpus: Annotated[Path, typer.Argument(help="Corpus JSONL to serve.")],
    host: Annotated[str, typer.Option(help="Interface to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder for the index.")] = None,
) -> None:
    """Serve POST /retrieve (Search-R1's schema) over a corpus until interrupted."""
    from turngym.envs.search.server import serve

    serve(corpus, host=host, port=port, cache_dir=cache_dir)


@app.command("query")
def search_query(
    query: Annotated[str, typer.Argument(help="What to search for.")],
    corpus: Annotated[
        Path | None, typer.Option(help="Corpus JSONL (default: the default env's world).")
    ] = None,
    url: Annotated[str | None, typer.Option(help="A /retrieve server instead of a local corpus.")] = None,
    k: Annotated[int, typer.Option(help="Passages to show.")] = 3,
) -> None:
    """Print the top-k passages for a query, as the env shows them."""
    from turngym.envs.search.data import load_corpus, synthetic_dataset
    from turngym.envs.search.env import format_docs
    from turngym.envs.search.retriever import RetrieverError, shared_bm25
    from turngym.envs.search.server import RemoteRetriever

    try:
        if url:
            with RemoteRetriever(url) as remote:
                docs = remote.retrieve([query], k)[0]
        else:
            c = load_corpus(corpus) if corpus else synthetic_dataset()[0]
            docs = shared_bm25(c).retrieve([query], k)[0]
    except RetrieverError as e:
        raise typer.BadParameter(str(e)) from e
    typer.echo(format_docs(docs))
