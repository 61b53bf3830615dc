"""GatedDeltaNet core through fla-core (chunked rule for prefill, fused recurrent for decode).

Same contract as gdn_torch.gdn_core_torch: raw q/k (fla l2-normalises them in fp32 in the kernel and maps
value head i to key head i // (Hv / Hk), the repeat_interleave convention), fp32 g/beta, fp32 state.
"""
from __future__ import annotations

import torch


def fla_available() -> bool:
    try:
        import fla.ops.gated_delta_rule  # noqa: F401
    except Exception:  # ImportError, or a triton/driver mismatch at import
        return False
    return True


def gdn_core_fla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                 state: torch.Tensor, decode: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    rule = fused_recurrent_gated_delta_rule if decode else chunk_gated_delta_rule
    # Keywords only: fused_recurrent's 5th positional parameter is gk, not beta.
    out, new_state = rule(
        q=q[None], k=k[None], v=v[None], g=g[None], beta=beta[None].to(q.dtype), scale=q.shape[-1] ** -0.5,
        initial_state=state[None], output_final_state=True, use_qk_l2norm_in_kernel=True,
    )
    return out[0], new_state[0]
