"""Torch reference of the GatedDeltaNet pieces: causal depthwise conv1d with state, and the gated delta
rule, chunked (prefill) and recurrent (decode). These are the references the fla/Triton kernels are
checked against. Shapes are heads-first: q, k [H, T, K]; v [H, T, V]; g, beta [H, T]; state [H, K, V].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [C, T], weight [C, W], state [C, W-1] (the previous W-1 inputs) -> (silu(conv) [C, T], new state)."""
    full = torch.cat([state.to(x.dtype), x], dim=-1)
    out = F.conv1d(full[None], weight[:, None, :], groups=x.shape[0])[0]
    return F.silu(out), full[:, full.shape[-1] - state.shape[-1]:]


def chunk_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
    state: torch.Tensor, chunk_size: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY/UT-transform) form; inputs fp32, q already scaled. Returns (o [H, T, V], final state)."""
    h, t, dk = k.shape
    pad = (-t) % chunk_size
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = (F.pad(x, (0, pad)) for x in (g, beta))
    n = (t + pad) // chunk_size
    q, k, v = (x.reshape(h, n, chunk_size, x.shape[-1]) for x in (q, k, v))
    g, beta = g.reshape(h, n, chunk_size), beta.reshape(h, n, chunk_size)

    k_beta, v_beta = k * beta[..., None], v * beta[..., None]
    gc = g.cumsum(-1)
    upper = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).triu(1)
    decay = (gc[..., :, None] - gc[..., None, :]).masked_fill(upper, float("-inf")).exp()
    # (I + strict_lower(beta K K^T * decay))^-1 applied by a unit-triangular solve.
    system = (k_beta @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * gc.exp()[..., None], upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_decayed = q * gc.exp()[..., None]
    k_to_end = k * (gc[..., -1:] - gc).exp()[..., None]
    chunk_decay = gc[..., -1].exp()[..., None, None]

    s = state.to(torch.float32)
    out = torch.empty_like(v)
    for i in range(n):
        v_new = u[:, i] - w[:, i] @ s
        out[:, i] = q_decayed[:, i] @ s + intra[:, i] @ v_new
        s = s * chunk_decay[:, i] + k_to_end[:, i].transpose(-1, -2) @ v_new
    return out.reshape(h, n * chunk_size, -1)[:, :t], s


def recurrent_gated_delta_rule(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token form (decode); inputs fp32, q already scaled. Returns (o [H, T, V], final state)."""
    s = state.to(torch.float32)
    out = torch.empty_like(v)
    for i in range(k.shape[1]):
        s = s * g[:, i].exp()[:, None, None]
        kv_mem = (s * k[:, i, :, None]).sum(dim=-2)
        delta = (v[:, i] - kv_mem) * beta[:, i, None]
        s = s + k[:, i, :, None] * delta[:, None, :]
        out[:, i] = (s * q[:, i, :, None]).sum(dim=-2)
    return out, s


def gdn_core_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   state: torch.Tensor, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The GatedDeltaNet core on raw projections: q, k [T, Hk, K]; v [T, Hv, V]; g, beta [T, Hv] (fp32);
    state [Hv, K, V] fp32. L2-normalises q/k in fp32, scales q by K^-0.5, maps k-heads to value heads by
    repeat_interleave, runs the chunked (prefill) or recurrent (decode) rule. -> (o [T, Hv, V] fp32, state)."""
    rep = v.shape[1] // k.shape[1]
    q = l2norm(q.float()).repeat_interleave(rep, dim=1) * q.shape[-1] ** -0.5
    k = l2norm(k.float()).repeat_interleave(rep, dim=1)
    rule = recurrent_gated_delta_rule if decode else chunk_gated_delta_rule
    out, new_state = rule(q.transpose(0, 1), k.transpose(0, 1), v.float().transpose(0, 1), g.transpose(0, 1),
                          beta.transpose(0, 1), state)
    return out.transpose(0, 1), new_state


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)
