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


def routed_experts_decode_reference(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Batch-1 reference that sums the k experts in top-k order, whatever their ids: the same bytes whether
    the ids name experts (resident) or cache slots (offloaded)."""
    inter = down.shape[-1]
    out = torch.zeros_like(x)
    for j, e in enumerate(ids[0].tolist()):
        h = F.linear(x, gate_up[e])
        h = F.silu(h[:, :inter]) * h[:, inter:]
        out += F.linear(h, down[e]) * weights[:, j, None]
    return out


def _nothing_to_copy() -> None:
    pass


class ResidentExperts:
    """All of a layer's experts on the compute device, stacked by expert id."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor):
        self.gate_up, self.down = gate_up, down

    def for_decode(self, ids: torch.Tensor):
        return ids, self.gate_up, self.down, _nothing_to_copy

    def for_prefill(self):
        return self.gate_up, self.down

    def release_prefill(self) -> None:
        pass


class SparseMoE:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels, experts, overlap):
        p = f"layers.{layer}.mlp."
        self.layer, self.top_k, self.kernels, self.overlap = layer, cfg.moe.top_k, kernels, overlap
        self.routing = None  # a synthetic RoutingTrace (benchmarks only): replaces the ids, keeps the weights
        self.router_w = w[p + "gate.weight"]
        self.experts = experts
        self.shared = tuple(w[p + f"shared_expert.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        self.shared_gate = w[p + "shared_expert_gate.weight"]

    def shared_expert(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(F.linear(x, self.shared_gate)) * swiglu(x, *self.shared)

    def forward(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        weights, ids = route(x, self.router_w, self.top_k)
        if self.routing is not None:
            ids = self.routing.ids(self.layer, x.shape[0])
        if decode and x.shape[0] == 1:
            ids, gate_up, down, copy = self.experts.for_decode(ids)
            shared = self.overlap.run(copy, lambda: self.shared_expert(x), x)
            return self.kernels.experts_decode(x, weights, ids, gate_up, down) + shared
        gate_up, down = self.experts.for_prefill()
        routed = self.kernels.experts_prefill(x, weights, ids, gate_up, down)
        self.experts.release_prefill()
        return routed + self.shared_expert(x)
