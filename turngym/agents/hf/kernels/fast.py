"""``FastForward``: the slots engine's own forward pass for Llama-family decoders, in few kernels.

A small model's decode step on a GPU costs what launching its kernels costs, so this pass does the
model's arithmetic in about 18 kernels a layer where transformers' Llama layer launches about 50
(why and the measurements: docs/engines.md):

* ``F.rms_norm`` for each norm; q, k and v in one matrix product, gate and up in one;
* rotary on q and k together from a per-position cos/sin table built from the model's own rotary
  module (every rope scaling transformers knows is honoured), the attention scale folded into q's;
* the new keys and values written into the slots with one ``index_put_`` each;
* decode attention as two batched matrix products on the cache's own strides (grouped-query heads,
  no repeated key/value heads); prefill attention by SDPA;
* the output and down projections as ``addmm`` onto the residual stream.

Logits equal transformers' to float rounding (tests compare them in float32 on CPU). The
concatenated q/k/v and gate/up weights are copies refreshed in place whenever a source parameter's
version counter moved (``refresh()``), so captured graphs see new weights.

On CUDA (``kernels=None``, where ``kernels.triton.problem`` finds nothing against it) attention, the
rotary with the cache write and the SwiGLU are Triton kernels (``turngym.agents.hf.kernels.triton``);
``kernels="torch"`` keeps the torch ops. A kernel that fails to build or run switches the pass to the
torch ops for good, with a warning (``kernels_problem`` says why).

Supported: ``model_type`` llama, mistral, qwen2 and qwen3 (dense; its q/k RMSNorms per head before
rotary), biases on any projection, tied or untied heads, SiLU MLPs and plain ``nn.Linear`` projections; ``problem(model)`` says why another model is not, and
the slots engine then runs transformers' forward.
"""

from __future__ import annotations

import logging
from typing import Any

from turngym.agents.hf.kernels import triton as hf_triton

log = logging.getLogger(__name__)

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
QK_NORMS = ("qwen3",)  # model types whose attention RMS-normalises q and k per head before rotary
# the pass's attention, rotary/cache write and SwiGLU: Triton kernels (kernels.triton; "interpret": the same
# through Triton's interpreter on CPU, for tests) or torch ops
KERNELS = ("triton", "torch", "interpret")


def problem(model: Any) -> str | None:
    """Why ``FastForward`` cannot run ``model`` (None: it can)."""
    import torch

    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in MODEL_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(MODEL_TYPES)}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (SiLU only)"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no model.layers / model.rotary_emb"
    if not isinstance(getattr(model, "lm_head", None), torch.nn.Linear):
        return "lm_head is not a plain nn.Linear"
    for i, layer in enumerate(inner.layers):
        att, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = [(att, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        names += [(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")]
        for owner, name in names:
            if type(getattr(owner, name, None)) is not torch.nn.Linear:
                return f"layer {i}: {name} is not a plain nn.Linear (LoRA or quantized?)"
        norms = [getattr(att, n, None) for n in ("q_norm", "k_norm")]
        if kind not in QK_NORMS and any(n is not None for n in norms):
            return f"layer {i}: q/k norms on a {kind} model"
        if kind in QK_NORMS and not all(_is_rms_norm(n) for n in norms):
            return f"layer {i}: q/k norms without weight/variance_epsilon"
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            if not hasattr(norm, "weight") or not hasattr(norm, "variance_epsilon"):
                return f"layer {i}: a norm without weight/variance_epsilon"
    return None


class _Layer:
    """One decoder layer's weights as the pass reads them."""

    def __init__(self, layer: Any):
        att, mlp = layer.self_attn, layer.mlp
        self.ln1, self.ln2 = layer.input_layernorm, layer.post_attention_layernorm
        self.qkv_parts = [att.q_proj, att.k_proj, att.v_proj]
        self.gate_up_parts = [mlp.gate_proj, mlp.up_proj]
        self.o, self.down = att.o_proj, mlp.down_proj
        self.qkv_w = self.qkv_b = self.gate_up_w = self.gate_up_b = None
        self.q_norm, self.k_norm = getattr(att, "q_norm", None), getattr(att, "k_norm", None)

    def norm_qk(self, qkv: Any, heads: int, kv_heads: int) -> Any:
        """``qkv`` ``[tokens, heads + 2 * kv_heads, head_dim]`` with q and k RMS-normalised per head
        (Qwen3, before rotary); unchanged for models without q/k norms."""
        if self.q_norm is None:
            return qkv
        import torch
        import torch.nn.functional as F

        d = qkv.shape[-1]
        q = F.rms_norm(qkv[:, :heads], (d,), self.q_norm.weight, self.q_norm.variance_epsilon)
        k = F.rms_norm(
            qkv[:, heads : heads + kv_heads], (d,), self.k_norm.weight, self.k_norm.variance_epsilon
        )
        return torch.cat([q, k, qkv[:, heads + kv_heads :]], dim=1)


class FastForward:
    """The forward pass of ``model`` (``problem(model)`` None) over the slots engine's KV buffers,
    for positions ``0 .. positions - 1``."""

    decode_attention = "matmul"  # or "sdpa": a decode step's attention as one SDPA call (see _attend)

    def __init__(self, model: Any, positions: int, kernels: str | None = None):
        import torch

        config = model.config
        dev = model.lm_head.weight.device
        if kernels is not None and kernels not in KERNELS:
            raise ValueError(f"kernels must be one of {', '.join(KERNELS)} or None, got {kernels!r}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.kernels_problem = hf_triton.problem(dev, head_dim, interpret=kernels == "interpret")
        if kernels is None:
            kernels = "torch" if self.kernels_problem else "triton"
        elif kernels != "torch" and self.kernels_problem:
            raise ValueError(
                f"kernels={kernels!r}, but the Triton kernels cannot run: {self.kernels_problem}"
            )
        self.kernels = kernels
        self.model = model
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.hidden = config.hidden_size
        self.intermediate = model.model.layers[0].mlp.gate_proj.out_features
        self.layers = [_Layer(x) for x in model.model.layers]
        self.scaling = float(model.model.layers[0].self_attn.scaling)
        self._versions: tuple[int, ...] | None = None
        dtype = model.lm_head.weight.dtype
        with torch.no_grad():
            probe = torch.zeros(1, dtype=dtype, device=dev)
            cos, sin = model.model.rotary_emb(probe, torch.arange(positions, device=dev)[None])
            cos, sin = cos[0].to(dtype), sin[0].to(dtype)  # [positions, head_dim]
            half = self.head_dim // 2
            sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # rotate_half's signs
            scale = torch.ones(self.heads + self.kv_heads, 1, dtype=dtype, device=dev)
            scale[: self.heads] = self.scaling  # q's share of the attention scaling, folded in
            self._cos, self._sin, self._head_scale = cos, sin, scale
        self.refresh()

    # ------------------------------------------------------------- weights
    def _sources(self) -> list[Any]:
        out = []
        for layer in self.layers:
            for m in (*layer.qkv_parts, *layer.gate_up_parts):
                out.append(m.weight)
                if m.bias is not None:
                    out.append(m.bias)
        return out

    def invalidate(self) -> None:
        """Rebuild the concatenated weights at the next ``refresh`` whatever the version counters say."""
        self._versions = None

    def refresh(self) -> bool:
        """Rebuild the concatenated weights if a source parameter changed since the last call
        (in place: a captured graph reads the same buffers); True when it did."""
        import torch

        sources = self._sources()
        versions = tuple(p._version for p in sources) + tuple(p.data_ptr() for p in sources)
        if versions == self._versions:
            return False
        with torch.no_grad():
            for layer in self.layers:
                layer.qkv_w = _concat([m.weight for m in layer.qkv_parts], layer.qkv_w)
                layer.gate_up_w = _concat([m.weight for m in layer.gate_up_parts], layer.gate_up_w)
                if any(m.bias is not None for m in layer.qkv_parts):
                    layer.qkv_b = _concat([_bias(m) for m in layer.qkv_parts], layer.qkv_b)
                if any(m.bias is not None for m in layer.gate_up_parts):
                    layer.gate_up_b = _concat([_bias(m) for m in layer.gate_up_parts], layer.gate_up_b)
        self._versions = versions  # the rebuild wrote only the copies, not the sources
        return True

    # ------------------------------------------------------------- the pass
    def logits(self, ids: Any, pos: Any, cache: Any, mask: Any) -> Any:
        """fp32 logits of each row's last position. ``ids``, ``pos``: ``[rows, n]``; ``cache``: the
        slots engine's ``_SlotCache`` with the pass's plan set (``index`` ``[rows, kv_heads, n]``,
        the flat buffer row of each new key; ``rows`` or ``width``; ``columns``); ``mask``: bool
        ``[rows, 1, n, columns]``, True where a query may attend."""
        import torch
        import torch.nn.functional as F

        if self.kernels != "torch":
            try:
                return self._logits_triton(ids, pos, cache)
            except Exception as e:  # noqa: BLE001 - a kernel this GPU or Triton cannot build or run
                self.kernels, self.kernels_problem = (
                    "torch",
                    f"a Triton kernel failed: {type(e).__name__}: {e}",
                )
                log.warning("the fast forward's Triton kernels failed (%s); torch ops from now on", e)
        rows, n = ids.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        x = self.model.model.embed_tokens(ids).view(rows * n, self.hidden)
        flat_pos = pos.reshape(-1)
        cos = self._cos[flat_pos][:, None, :] * self._head_scale  # [rows*n, h+kv, d]
        sin = self._sin[flat_pos][:, None, :] * self._head_scale
        index = cache.index.transpose(1, 2).reshape(rows * n, kv)
        # decode by matmuls: where masked_fill writes -inf; else SDPA's own mask
        blocked = ~mask if n == 1 and self.decode_attention == "matmul" else mask
        for i, layer in enumerate(self.layers):
            a = F.rms_norm(x, (self.hidden,), layer.ln1.weight, layer.ln1.variance_epsilon)
            qkv = layer.norm_qk(_linear(a, layer.qkv_w, layer.qkv_b).view(rows * n, h + 2 * kv, d), h, kv)
            qk = qkv[:, : h + kv]
            qk = torch.addcmul(qk * cos, torch.roll(qk, d // 2, dims=-1), sin)
            keys, values = cache.keys[i], cache.values[i]
            keys.view(-1, d).index_put_((index,), qk[:, h:])
            values.view(-1, d).index_put_((index,), qkv[:, h + kv :])
            if cache.rows is None:
                k_all, v_all = (
                    keys[: cache.width, :, : cache.columns],
                    values[: cache.width, :, : cache.columns],
                )
            else:
                k_all, v_all = keys[cache.rows, :, : cache.columns], values[cache.rows, :, : cache.columns]
            att = self._attend(qk[:, :h], k_all, v_all, blocked, rows, n)
            x = _linear(att, layer.o.weight, layer.o.bias, residual=x)
            a = F.rms_norm(x, (self.hidden,), layer.ln2.weight, layer.ln2.variance_epsilon)
            gu = _linear(a, layer.gate_up_w, layer.gate_up_b)
            a = F.silu(gu[:, : self.intermediate]) * gu[:, self.intermediate :]
            x = _linear(a, layer.down.weight, layer.down.bias, residual=x)
        return self._head(x, rows, n)

    def _head(self, x: Any, rows: int, n: int) -> Any:
        """fp32 logits of each row's last position from the residual stream ``x`` ``[rows*n, hidden]``."""
        import torch.nn.functional as F

        last = x.view(rows, n, self.hidden)[:, -1]
        norm = self.model.model.norm
        last = F.rms_norm(last, (self.hidden,), norm.weight, norm.variance_epsilon)
        head = self.model.lm_head
        return _linear(last, head.weight, head.bias).float()

    def _logits_triton(self, ids: Any, pos: Any, cache: Any) -> Any:
        """``logits`` with ``kernels.triton``'s kernels: rotary and the cache write in one, attention over
        the slots in place (each query up to its own column: ``pos``), SwiGLU in one. The mask is
        not needed: a query attends to the columns ``0..pos`` of its slot, which is what the
        callers' masks say (a padded prefill query: position 0, column 0)."""
        import torch
        import torch.nn.functional as F

        interpret = self.kernels == "interpret"
        rows, n = ids.shape
        h, kv = self.heads, self.kv_heads
        x = self.model.model.embed_tokens(ids).view(rows * n, self.hidden)
        flat_pos = pos.reshape(-1)
        index = cache.index.transpose(1, 2).reshape(rows * n, kv)
        slots = cache.rows if cache.rows is not None else torch.arange(cache.width, device=ids.device)
        for i, layer in enumerate(self.layers):
            keys, values = cache.keys[i], cache.values[i]
            a = F.rms_norm(x, (self.hidden,), layer.ln1.weight, layer.ln1.variance_epsilon)
            qkv = _linear(a, layer.qkv_w, layer.qkv_b)
            if layer.q_norm is not None:
                qkv = layer.norm_qk(qkv.view(rows * n, h + 2 * kv, -1), h, kv).view(rows * n, -1)
            q = hf_triton.rotary_write(
                qkv,
                self._cos,
                self._sin,
                flat_pos,
                index,
                keys,
                values,
                h,
                kv,
                self.scaling,
                interpret=interpret,
            )
            att = hf_triton.slot_attention(
                q, keys, values, slots, flat_pos, n, cache.columns, interpret=interpret
            )
            x = _linear(att, layer.o.weight, layer.o.bias, residual=x)
            a = F.rms_norm(x, (self.hidden,), layer.ln2.weight, layer.ln2.variance_epsilon)
            gu = _linear(a, layer.gate_up_w, layer.gate_up_b)
            x = _linear(
                hf_triton.swiglu(gu, self.intermediate, interpret=interpret),
                layer.down.weight,
                layer.down.bias,
                residual=x,
            )
        return self._head(x, rows, n)

    def _attend(self, q: Any, k_all: Any, v_all: Any, blocked: Any, rows: int, n: int) -> Any:
        """Attention of ``q`` ``[rows*n, heads, d]`` (scaled already) over the cache columns
        ``k_all``/``v_all`` ``[rows, kv_heads, columns, d]``; ``[rows*n, heads*d]``. ``blocked``:
        where a decode query may not attend, or (prefill) the mask itself."""
        import torch

        h, kv, d = self.heads, self.kv_heads, self.head_dim
        g, cols = h // kv, k_all.shape[2]
        if n == 1 and self.decode_attention == "sdpa":  # each key/value head's g query heads as g queries
            from torch.nn.functional import scaled_dot_product_attention

            out = scaled_dot_product_attention(
                q.view(rows, kv, g, d), k_all, v_all, attn_mask=blocked, scale=1.0
            )
            return out.reshape(rows, h * d)
        if n == 1:  # a decode step: the query heads grouped by key/value head, two matmuls
            qg = q.reshape(rows * kv, g, d)
            scores = torch.bmm(qg, k_all.reshape(rows * kv, cols, d).transpose(1, 2))
            scores.view(rows, kv, g, cols).masked_fill_(blocked, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            return torch.bmm(probs, v_all.reshape(rows * kv, cols, d)).view(rows, h * d)
        from torch.nn.functional import scaled_dot_product_attention

        qh = q.view(rows, n, h, d).transpose(1, 2)
        if g > 1:
            k_all, v_all = k_all.repeat_interleave(g, dim=1), v_all.repeat_interleave(g, dim=1)
        out = scaled_dot_product_attention(qh, k_all, v_all, attn_mask=blocked, scale=1.0)
        return out.transpose(1, 2).reshape(rows * n, h * d)


def _is_rms_norm(m: Any) -> bool:
    return m is not None and hasattr(m, "weight") and hasattr(m, "variance_epsilon")


def _bias(m: Any) -> Any:
    import torch

    return (
        m.bias
        if m.bias is not None
        else torch.zeros(m.out_features, dtype=m.weight.dtype, device=m.weight.device)
    )


def _concat(parts: list[Any], out: Any) -> Any:
    """``parts`` concatenated along dim 0, into ``out`` when it has the shape (a graph reads it)."""
    import torch

    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    if (
        out is None
        or tuple(out.shape) != shape
        or out.dtype != parts[0].dtype
        or out.device != parts[0].device
    ):
        return torch.cat([p.detach() for p in parts], dim=0)
    return torch.cat([p.detach() for p in parts], dim=0, out=out)


def _linear(x: Any, weight: Any, bias: Any = None, residual: Any = None) -> Any:
    """``x @ weight.T`` (+ ``bias``) (+ ``residual``) in one kernel where it can be."""
    import torch

    if residual is not None:
        out = torch.addmm(residual, x, weight.t())
        return out if bias is None else out.add_(bias)
    if bias is not None:
        return torch.addmm(bias, x, weight.t())
    return torch.mm(x, weight.t())
