"""A decode benchmark's sequence brought to its length without a prefill.

Why: a decode step reads the same bytes at a given length whatever the values in its KV cache and recurrent
state (no kernel of the step branches on them), but a prefill to that length makes a fresh device machine
compile FlashInfer's prefill module, fla's chunked delta rule and the grouped MoE kernels first (~2 min of a
lent machine's call, ../shared/device/README.md) and costs its own seconds in every arm. A decode A/B needs
none of that. Not for the slot cache's figures: there a prefill decides which experts the slots hold.
torch is imported inside the function only (the bench package's rule).
"""
from __future__ import annotations

# The values' scale: a prefill's K and V leave the attention's norms near 1, its recurrent state well under it.
KV_SCALE = 1.0
STATE_SCALE = 0.05
CHUNK = 4096  # positions written a call (bounds the temporary rows at long contexts)


def fill_context(model, state, length: int, seed: int = 0) -> None:
    """Bring the empty `state` to `length` positions as a prefill would leave its shapes: every attention layer's
    K and V rows 0..length-1 and every GatedDeltaNet layer's conv and recurrent state set to seeded random
    values, the routing trace (if any) moved past the positions, state.seq_len = length."""
    import torch

    if state.seq_len != 0:
        raise ValueError(f"fill_context needs an empty sequence, this one holds {state.seq_len} tokens")
    if length < 1:
        raise ValueError(f"length must be positive, got {length}")
    state.check_room(length)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    attention = model.kernels.attention
    with torch.inference_mode():
        for kv in state.kv.values():
            heads, dim = kv.k.shape[-2:]
            for start in range(0, length, CHUNK):
                t = min(CHUNK, length - start)
                k, v = ((KV_SCALE * torch.randn(t, heads, dim, generator=gen)).to(kv.k.device, kv.k.dtype)
                        for _ in range(2))
                positions = torch.arange(start, start + t, device=kv.k.device)
                attention.write(kv, k, v, positions, start)
        for layer in state.conv:
            for t in (state.conv[layer], state.recurrent[layer]):
                t.copy_(STATE_SCALE * torch.randn(t.shape, generator=gen))
        if model.routing is not None:
            model.routing.advance(length)
    state.seq_len = length
