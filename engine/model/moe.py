"""The sparse MoE block: softmax router (fp32) -> top-k -> renormalise; routed SwiGLU experts; shared expert
scaled by sigmoid(shared_expert_gate(x)). Reference path over stacked expert weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from .ops import swiglu


def route(x: torch.Tensor, router_w: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k] in x.dtype, expert ids [T, k])."""
    probs = torch.softmax(F.linear(x, router_w), dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    return top.to(x.dtype), ids


def routed_experts_reference(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Loop over the experts that were hit. gate_up [E, 2I, H] (gate rows first), down [E, H, I]."""
    out = torch.zeros_like(x)
    inter = down.shape[-1]
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        h = F.linear(x[tok], gate_up[e])
        h = F.silu(h[:, :inter]) * h[:, inter:]
        y = F.linear(h, down[e]) * weights[tok, slot, None]
        out.index_add_(0, tok, y.to(out.dtype))
    return out


class SparseMoE:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels):
        p = f"layers.{layer}.mlp."
        self.layer, self.top_k, self.kernels = layer, cfg.moe.top_k, kernels
        self.router_w = w[p + "gate.weight"]
        self.gate_up, self.down = w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"]
        self.shared = tuple(w[p + f"shared_expert.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        self.shared_gate = w[p + "shared_expert_gate.weight"]

    def shared_expert(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x, self.shared_gate)) * swiglu(x, *self.shared)

    def forward(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        weights, ids = route(x, self.router_w, self.top_k)
        experts = self.kernels.experts_decode if decode and x.shape[0] == 1 else self.kernels.experts_prefill
        routed = experts(x, weights, ids, self.gate_up, self.down)
        return routed + self.shared_expert(x)
