"""Per-sequence state of the hybrid model: KV for full-attention layers, conv + recurrent state for
GatedDeltaNet layers. The recurrent state cannot be rolled back, so turn boundaries are kept as snapshots."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import FULL_ATTENTION, ModelConfig
from ..errors import ContextLimitError


class ContiguousKV:
    """One layer's K/V in one growing buffer [capacity, kv_heads, head_dim] (the CPU/SDPA backend's cache)."""

    def __init__(self, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device, capacity: int = 256):
        self.k = torch.zeros(capacity, kv_heads, head_dim, dtype=dtype, device=device)
        self.v = torch.zeros_like(self.k)

    def write(self, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        end = start + k.shape[0]
        if end > self.k.shape[0]:
            cap = max(end, 2 * self.k.shape[0])
            grown_k = self.k.new_zeros(cap, *self.k.shape[1:])
            grown_v = self.v.new_zeros(cap, *self.v.shape[1:])
            grown_k[: self.k.shape[0]] = self.k
            grown_v[: self.v.shape[0]] = self.v
            self.k, self.v = grown_k, grown_v
        self.k[start:end] = k
        self.v[start:end] = v

    def read(self, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:end], self.v[:end]


@dataclass(frozen=True)
class StateSnapshot:
    """The recurrent part of a SequenceState at one length; KV beyond `seq_len` is simply ignored on restore."""

    seq_len: int
    conv: dict
    recurrent: dict


class SequenceState:
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, device: torch.device, max_len: int, attention):
        self.max_len = max_len
        self.seq_len = 0
        lin = cfg.linear
        self.kv: dict = {}
        self.conv: dict[int, torch.Tensor] = {}
        self.recurrent: dict[int, torch.Tensor] = {}
        for i, kind in enumerate(cfg.layer_types):
            if kind == FULL_ATTENTION:
                self.kv[i] = attention.new_kv(dtype, device, max_len)
            else:
                self.conv[i] = torch.zeros(lin.conv_dim, lin.conv_kernel - 1, dtype=dtype, device=device)
                # fp32 whatever the compute dtype (mamba_ssm_dtype float32).
                self.recurrent[i] = torch.zeros(
                    lin.num_value_heads, lin.key_head_dim, lin.value_head_dim, dtype=torch.float32, device=device
                )

    def check_room(self, new_tokens: int) -> None:
        if self.seq_len + new_tokens > self.max_len:
            raise ContextLimitError(
                f"the conversation needs {self.seq_len + new_tokens} tokens but the context limit is {self.max_len}: "
                "shorten it (drop earlier messages), or raise the context limit if memory allows"
            )

    def snapshot(self) -> StateSnapshot:
        return StateSnapshot(
            self.seq_len,
            {i: t.clone() for i, t in self.conv.items()},
            {i: t.clone() for i, t in self.recurrent.items()},
        )

    def reset(self) -> None:
        """Back to an empty sequence, keeping every buffer (a captured graph holds their addresses)."""
        self.seq_len = 0
        for t in self.conv.values():
            t.zero_()
        for t in self.recurrent.values():
            t.zero_()

    def restore(self, snap: StateSnapshot) -> None:
        self.seq_len = snap.seq_len
        for i, t in snap.conv.items():
            self.conv[i].copy_(t)
        for i, t in snap.recurrent.items():
            self.recurrent[i].copy_(t)
