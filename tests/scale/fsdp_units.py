"""FSDP2 units of the tiny model in one gloo process (world 1): every decoder layer and the root are
FSDP modules, the parameters DTensors; the full copy keeps tied weights tied and buffers in their
dtype, and refreshed from the shards equals them in the copy's own dtype; loading full weights into the shards (no collective) reaches both. Exits non-zero on a
failed check.

    python tests/scale/fsdp_units.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from turngym.agents.models import load_model
from turngym.trainer.config import FSDPSettings
from turngym.trainer.fsdp import FullWeights, decoder_layers, load_full_into_sharded, shard_model


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh

    model = load_model("tiny", device="cpu", dtype="float32")
    layers = decoder_layers(model)
    assert len(layers) == model.config.num_hidden_layers, layers
    copy = FullWeights(model, torch.bfloat16)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    head, embed = copy.module.get_output_embeddings(), copy.module.get_input_embeddings()
    assert (head.weight is embed.weight) == tied  # ties survive the copy
    buffers = dict(model.named_buffers())
    for name, buf in copy.module.named_buffers():  # rotary frequencies keep their dtype
        assert buf.dtype == buffers[name].dtype, name
    shard_model(model, init_device_mesh("cpu", (1,)), FSDPSettings(), "cpu")
    assert isinstance(model, FSDPModule) and all(isinstance(m, FSDPModule) for m in layers)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().add_(0.5)
    copy.refresh(model)
    own = dict(copy.module.named_parameters())
    for name, p in model.named_parameters():
        assert own[name].dtype == torch.bfloat16, name
        torch.testing.assert_close(own[name], p.full_tensor().to(torch.bfloat16), rtol=0, atol=0)
    name = next(n for n, _ in model.named_parameters() if "layers.0." in n)
    weights = {name: torch.full_like(own[name], 3.0, dtype=torch.float32)}
    load_full_into_sharded(model, weights)
    assert bool((dict(model.named_parameters())[name].full_tensor() == 3.0).all())
    try:
        load_full_into_sharded(model, {"no.such.weight": torch.zeros(1)})
    except ValueError as e:
        assert "no.such.weight" in str(e)
    else:
        raise AssertionError("an unknown weight was accepted")
    ids = torch.tensor([[1, 2, 3]])
    assert model(input_ids=ids).logits.shape[:2] == (1, 3)  # the sharded model still runs
    dist.destroy_process_group()
    print("ok")


if __name__ == "__main__":
    main()
