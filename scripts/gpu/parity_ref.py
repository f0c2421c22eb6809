"""A plain-PyTorch forward of a llama/qwen2/qwen3 decoder, written from the Hugging Face modelling
conventions (docs/models.md, FACTS.md), for parity.py --self-test where transformers is absent.
It is an independent second implementation, not the reference of record: on the GPU machine
transformers itself is compared.
"""

import math

import torch
import torch.nn.functional as F


def _rms_norm(x, w, eps):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return w * x32.to(x.dtype)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(seq, dim, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


def _attention(x, w, p, cfg, cos, sin):
    b, t, _ = x.shape
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // h

    def proj(name, heads):
        y = F.linear(x, w[f"{p}self_attn.{name}_proj.weight"],
                     w.get(f"{p}self_attn.{name}_proj.bias"))
        return y.view(b, t, heads, d).transpose(1, 2)

    q, k, v = proj("q", h), proj("k", kv), proj("v", kv)
    if cfg["model_type"] == "qwen3":
        q = _rms_norm(q, w[f"{p}self_attn.q_norm.weight"], cfg["rms_norm_eps"])
        k = _rms_norm(k, w[f"{p}self_attn.k_norm.weight"], cfg["rms_norm_eps"])
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    k = k.repeat_interleave(h // kv, dim=1)
    v = v.repeat_interleave(h // kv, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    mask = torch.ones(t, t, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(mask, float("-inf")).softmax(-1)
    out = (probs @ v).transpose(1, 2).reshape(b, t, h * d)
    return F.linear(out, w[f"{p}self_attn.o_proj.weight"], w.get(f"{p}self_attn.o_proj.bias"))


def forward(cfg, w, ids):
    """Logits [B, T, V] of parameters `w` ({HF name: tensor}) on `ids` [B, T]."""
    eps = cfg["rms_norm_eps"]
    x = F.embedding(ids, w["model.embed_tokens.weight"])
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    cos, sin = _rope(ids.shape[1], d, cfg["rope_theta"])
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        x = x + _attention(_rms_norm(x, w[p + "input_layernorm.weight"], eps), w, p, cfg, cos, sin)
        y = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        y = F.silu(F.linear(y, w[p + "mlp.gate_proj.weight"])) * F.linear(y, w[p + "mlp.up_proj.weight"])
        x = x + F.linear(y, w[p + "mlp.down_proj.weight"])
    x = _rms_norm(x, w["model.norm.weight"], eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return F.linear(x, head)


def hf_loss(logits, labels):
    """Hugging Face's causal-LM loss: logits[:, t] against labels[:, t + 1], -100 ignored, mean."""
    v = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, v).float(), labels[:, 1:].reshape(-1),
                           ignore_index=-100)


def forward_backward(cfg, weights, ids):
    """{"logits", "loss", "grad.<name>"} of one forward/backward in float32."""
    w = {k: v.detach().float().clone().requires_grad_(True) for k, v in weights.items()}
    logits = forward(cfg, w, ids)
    loss = hf_loss(logits, ids)
    loss.backward()
    out = {"logits": logits.detach(), "loss": loss.detach()}
    out.update({"grad." + k: v.grad for k, v in w.items()})
    return out
