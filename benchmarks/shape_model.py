"""Write a random-init model of a real shape to a directory that ``turngym train`` can load.

Memory and speed at 1.5B–8B are measured on models of the real dimensions (``benchmarks/fsdp.py``'s
``SHAPES``: Qwen2.5-1.5B's and Qwen2.5-7B's, vocabulary 151,936) with random weights: no hub download,
no learning. The tokenizer and chat template come from a model turngym can resolve (``smollm2-135m``
once prepared, ``tiny``, or a directory); sampled ids past the tokenizer's vocabulary decode to
nothing, which the envs see as an empty (invalid) action — the work per step is the real one.

    python benchmarks/shape_model.py --shape 7b --tokenizer smollm2-135m --out /root/m7b --device cuda
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fsdp import SHAPES, build_model  # noqa: E402


def write_shape_model(
    shape: str,
    tokenizer: str,
    out: str | Path,
    device: str = "cpu",
    dtype: str = "bfloat16",
    vocab: int | None = None,
) -> dict:
    """Build the shape with random weights on ``device``, save it (safetensors) with ``tokenizer``'s files."""
    from turngym.agents.models import load_tokenizer, resolve_model

    t0 = time.perf_counter()
    out = Path(out)
    model = build_model(shape, device, dtype, vocab=vocab)
    tok = load_tokenizer(resolve_model(tokenizer))
    model.config.bos_token_id = tok.bos_token_id
    model.config.eos_token_id = tok.eos_token_id
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out, max_shard_size="5GB")
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"shape": shape, "params": params, "out": str(out), "seconds": round(time.perf_counter() - t0, 1)}
    (out / "shape.json").write_text(json.dumps(info))
    return info


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), required=True)
    ap.add_argument(
        "--tokenizer", default="smollm2-135m", help="a model name or directory to take the tokenizer from"
    )
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--vocab", type=int, default=None, help="override the shape's vocabulary size")
    args = ap.parse_args(argv)
    print(
        json.dumps(
            write_shape_model(args.shape, args.tokenizer, args.out, args.device, args.dtype, args.vocab)
        )
    )


if __name__ == "__main__":
    main()
