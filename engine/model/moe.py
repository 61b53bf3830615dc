"""The sparse MoE block: softmax router (fp32) -> top-k -> renormalise; routed SwiGLU experts; shared expert
scaled by sigmoid(shared_expert_gate(x)). Reference path over stacked expert weights."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..config import ModelConfig
from ..quant.nvfp4_rows import dequant_expert_rows
from .ops import swiglu
from ..quant.linear import linear


def route(x: torch.Tensor, router_w: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (weights [T, k] in x.dtype, expert ids [T, k])."""
    probs = torch.softmax(F.linear(x, router_w), dim=-1, dtype=torch.float32)
    top, ids = torch.topk(probs, top_k, dim=-1)
    top = top / top.sum(dim=-1, keepdim=True)
    return top.to(x.dtype), ids


def routed_experts_reference(
    x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
) -> torch.Tensor:
    """Loop over the experts that were hit. gate_up [E, 2I, H] (gate rows first), down [E, H, I]. Each token's
    k outputs are summed in top-k order (as the Triton kernel does), so the bytes do not depend on how the
    experts are numbered: by expert id (resident) or by cache slot (a short prefill through the slots)."""
    inter = down.shape[-1]
    pair_out = torch.zeros(x.shape[0], ids.shape[1], x.shape[1], dtype=x.dtype, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        h = F.linear(x[tok], gate_up[e])
        h = F.silu(h[:, :inter]) * h[:, inter:]
        pair_out[tok, slot] = (F.linear(h, down[e]) * weights[tok, slot, None]).to(x.dtype)
    out = pair_out[:, 0].clone()
    for j in range(1, ids.shape[1]):
        out += pair_out[:, j]
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


def nvfp4_experts_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                            hidden: int, inter: int) -> torch.Tensor:
    """Prefill over NVFP4 rows [E, row_bytes]: dequantize the experts that were hit, then the dense reference."""
    used = torch.unique(ids)
    gate_up, down = dequant_expert_rows(rows[used], hidden, inter, x.dtype)
    compact = torch.full((rows.shape[0],), -1, dtype=ids.dtype, device=ids.device)
    compact[used] = torch.arange(used.numel(), dtype=ids.dtype, device=ids.device)  # keeps the id order
    return routed_experts_reference(x, weights, compact[ids], gate_up, down)


def nvfp4_experts_decode_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                                   hidden: int, inter: int) -> torch.Tensor:
    """Batch-1 over NVFP4 rows (experts or slots): dequantize the k rows, sum in top-k order."""
    gate_up, down = dequant_expert_rows(rows[ids.reshape(-1)], hidden, inter, x.dtype)
    order = torch.arange(ids.shape[-1], device=ids.device)[None]
    return routed_experts_decode_reference(x, weights, order, gate_up, down)


def _nothing_to_copy() -> None:
    pass


class ResidentExperts:
    """All of a layer's experts on the compute device, by expert id: (gate_up, down) stacked in the compute
    dtype ("dense"), or (NVFP4 rows,) ("nvfp4")."""

    def __init__(self, weights: tuple[torch.Tensor, ...], fmt: str = "dense"):
        self.weights, self.fmt = weights, fmt

    def for_decode(self, ids: torch.Tensor):
        return ids, self.weights, _nothing_to_copy

    def for_prefill(self, ids: torch.Tensor):
        return ids, self.weights

    def release_prefill(self) -> None:
        pass


class SparseMoE:
    def __init__(self, cfg: ModelConfig, layer: int, w: dict[str, torch.Tensor], kernels, experts, overlap):
        p = f"layers.{layer}.mlp."
        self.layer, self.top_k, self.kernels, self.overlap = layer, cfg.moe.top_k, kernels, overlap
        self.hidden, self.inter = cfg.hidden_size, cfg.moe.intermediate_size
        self.routing = None  # a synthetic RoutingTrace (benchmarks only): replaces the ids, keeps the weights
        self.router_w = w[p + "gate.weight"]
        self.experts = experts
        self.shared = tuple(w[p + f"shared_expert.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        self.shared_gate = w[p + "shared_expert_gate.weight"]

    def shared_expert(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(linear(x, self.shared_gate)) * swiglu(x, *self.shared)

    def forward(self, x: torch.Tensor, decode: bool) -> torch.Tensor:
        weights, ids = route(x, self.router_w, self.top_k)
        if self.routing is not None:
            ids = self.routing.ids(self.layer, x.shape[0])
        nvfp4 = self.experts.fmt == "nvfp4"
        if decode and x.shape[0] == 1:
            ids, expert_weights, copy = self.experts.for_decode(ids)
            shared = self.overlap.run(copy, lambda: self.shared_expert(x), x)
            kernel = self.kernels.experts_decode_nvfp4 if nvfp4 else self.kernels.experts_decode
            return kernel(x, weights, ids, *expert_weights) + shared
        kernel = self.kernels.experts_prefill_nvfp4 if nvfp4 else self.kernels.experts_prefill
        ids, expert_weights = self.experts.for_prefill(ids)
        routed = kernel(x, weights, ids, *expert_weights)
        self.experts.release_prefill()
        return routed + self.shared_expert(x)
