"""One routed expert in its native NVFP4 bytes, as one bank/slot row (torch only; the kernels read the same
layout). The miss copy and the prefill stream then move 4-bit weights: 1,769,484 B per Qwen3.6 expert
instead of 6,291,456 B in BF16.

Row layout: gate_up packed [2I, H/2] | gate_up E4M3 scale bytes [2I, H/16] | down packed [H, I/2] |
down scale bytes [H, I/16] | three fp32 global scales (gate, up, down). Gate rows 0..I-1 and up rows I..2I-1
share the gate_up blocks but keep their own global scale, as the checkpoint stores them.
"""
from __future__ import annotations

import torch

from .formats import dequant_nvfp4, quantize_nvfp4

NVFP4_ROWS = "nvfp4"  # the bank/slot format name (the other one is "dense": compute-dtype gate_up + down)


def nvfp4_expert_row_bytes(hidden: int, inter: int) -> int:
    return 2 * inter * hidden // 2 + 2 * inter * hidden // 16 + hidden * inter // 2 + hidden * inter // 16 + 12


ROW_ALIGN = 16  # bytes: the row stride of the engine's row containers (bank, slots, resident rows)


def nvfp4_expert_row_stride(hidden: int, inter: int) -> int:
    """The stride at which the engine holds NVFP4 rows: the row's bytes rounded up to 16 (1,769,488 for
    Qwen3.6's 1,769,484). Every row then starts 16-byte aligned (its parts too: each is a multiple of 16 bytes
    from the row's start), so kernels may load 16 bytes a thread; the padding is never read."""
    return -(-nvfp4_expert_row_bytes(hidden, inter) // ROW_ALIGN) * ROW_ALIGN


def padded_rows(rows: torch.Tensor, hidden: int, inter: int) -> torch.Tensor:
    """rows uint8 [E, row bytes or more] -> the same rows at nvfp4_expert_row_stride (a new tensor on the same
    device, the padding zeros), or rows itself where it already has that stride."""
    stride = nvfp4_expert_row_stride(hidden, inter)
    need = nvfp4_expert_row_bytes(hidden, inter)
    if rows.dim() != 2 or rows.dtype != torch.uint8 or rows.shape[1] < need:
        raise ValueError(f"NVFP4 rows must be uint8 [E, >= {need}], got {tuple(rows.shape)} {rows.dtype}")
    if rows.shape[1] == stride and rows.is_contiguous():
        return rows
    out = torch.zeros(rows.shape[0], stride, dtype=torch.uint8, device=rows.device)
    out[:, :need].copy_(rows[:, :need])
    return out


def pack_nvfp4_expert(gate: tuple, up: tuple, down: tuple) -> torch.Tensor:
    """(packed, scale, scale2) triples of one expert's gate/up/down -> its uint8 row."""
    parts = [torch.cat([gate[0], up[0]]).reshape(-1), torch.cat([gate[1], up[1]]).view(torch.uint8).reshape(-1),
             down[0].reshape(-1), down[1].view(torch.uint8).reshape(-1),
             torch.stack([gate[2].float().reshape(()), up[2].float().reshape(()), down[2].float().reshape(())])
             .view(torch.uint8)]
    return torch.cat([p.contiguous().view(torch.uint8) for p in parts])


def unpack_nvfp4_expert(row: torch.Tensor, hidden: int, inter: int) -> tuple[tuple, tuple, tuple]:
    """The inverse of pack_nvfp4_expert: -> (packed, scale e4m3, scale2 fp32) for gate, up and down."""
    h, i = hidden, inter
    sizes = [2 * i * h // 2, 2 * i * h // 16, h * i // 2, h * i // 16, 12]
    # A row may be wider than one expert (padded strides): the expert is its first sum(sizes) bytes.
    gu_w, gu_s, dn_w, dn_s, glob = torch.split(row.reshape(-1)[:sum(sizes)], sizes)
    gu_w, gu_s = gu_w.view(2 * i, h // 2), gu_s.view(torch.float8_e4m3fn).view(2 * i, h // 16)
    g = glob.clone().view(torch.float32)  # a fresh, aligned buffer for the fp32 view
    return ((gu_w[:i], gu_s[:i], g[0]), (gu_w[i:], gu_s[i:], g[1]),
            (dn_w.view(h, i // 2), dn_s.view(torch.float8_e4m3fn).view(h, i // 16), g[2]))


def quantize_expert_rows(gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Stacked experts gate_up [E, 2I, H], down [E, H, I] (any float dtype) -> NVFP4 rows [E, row_bytes]
    (ModelOpt's recipe per matrix, as scripts/quantize_nvfp4.py writes checkpoints)."""
    inter = gate_up.shape[1] // 2
    rows = [pack_nvfp4_expert(quantize_nvfp4(gu[:inter]), quantize_nvfp4(gu[inter:]), quantize_nvfp4(dn))
            for gu, dn in zip(gate_up, down)]
    return torch.stack(rows)


def dequant_expert_rows(rows: torch.Tensor, hidden: int, inter: int,
                        dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 rows [n, row_bytes] -> gate_up [n, 2I, H], down [n, H, I] in `dtype` (the torch reference)."""
    gate_up, down = [], []
    for row in rows:
        g, u, d = unpack_nvfp4_expert(row, hidden, inter)
        gate_up.append(torch.cat([dequant_nvfp4(*g, dtype=torch.float32), dequant_nvfp4(*u, dtype=torch.float32)]))
        down.append(dequant_nvfp4(*d, dtype=torch.float32))
    return torch.stack(gate_up).to(dtype), torch.stack(down).to(dtype)
