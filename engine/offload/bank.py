"""The host expert bank: every routed expert of every layer, one contiguous row per expert.

Row layout (compute dtype): gate_up [2I, H] then down [H, I], so one expert is one copy and a slot on the
GPU has the same layout. Pinned when a GPU is present (a pageable H2D copy runs at ~6 GB/s instead of ~55).
Filled layer by layer while the checkpoint streams, so no second full copy is held in pageable memory.
"""
from __future__ import annotations

import torch

from ..config import ModelConfig
from ..errors import ResourceError
from ..quant.nvfp4_rows import NVFP4_ROWS, nvfp4_expert_row_bytes, nvfp4_expert_row_stride

DENSE = "dense"  # rows in the compute dtype: gate_up [2I, H] then down [H, I]


def expert_row_elems(cfg: ModelConfig) -> int:
    return 3 * cfg.moe.intermediate_size * cfg.hidden_size


def split_rows(rows: torch.Tensor, cfg: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, row] -> strided views gate_up [N, 2I, H] and down [N, H, I] (no copy)."""
    h, i = cfg.hidden_size, cfg.moe.intermediate_size
    n, row = rows.shape[0], rows.shape[1]
    gate_up = rows.as_strided((n, 2 * i, h), (row, h, 1))
    down = rows.as_strided((n, h, i), (row, i, 1), storage_offset=rows.storage_offset() + 2 * i * h)
    return gate_up, down


def host_ram_available() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class HostExpertBank:
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype, pin: bool, fmt: str = DENSE):
        """fmt DENSE: rows in the compute dtype; NVFP4_ROWS: the checkpoint's 4-bit bytes (uint8 rows)."""
        if fmt not in (DENSE, NVFP4_ROWS):
            raise ValueError(f"unknown expert row format {fmt!r}")
        self.cfg, self.fmt = cfg, fmt
        h, i = cfg.hidden_size, cfg.moe.intermediate_size
        self.dtype = torch.uint8 if fmt == NVFP4_ROWS else dtype
        # NVFP4 rows at a 16-byte stride (quant/nvfp4_rows.py): the slots and stream buffers take the same one
        self.row_elems = nvfp4_expert_row_stride(h, i) if fmt == NVFP4_ROWS else expert_row_elems(cfg)
        self.packed_elems = nvfp4_expert_row_bytes(h, i) if fmt == NVFP4_ROWS else self.row_elems
        rows = cfg.num_layers * cfg.moe.num_experts
        need = rows * self.row_elems * self.dtype.itemsize
        avail = host_ram_available()
        if avail is not None and need > avail:
            raise ResourceError(
                f"the expert bank needs {need / 2**30:.1f} GiB of host RAM and {avail / 2**30:.1f} GiB is available: "
                "use the NVFP4 checkpoint (about 17 GiB of experts), close other programs, or add RAM"
            )
        self.rows = torch.empty(rows, self.row_elems, dtype=self.dtype, pin_memory=pin)
        self.pinned = pin
        self.bytes = need

    def layer_rows(self, layer: int) -> torch.Tensor:
        e = self.cfg.moe.num_experts
        return self.rows[layer * e:(layer + 1) * e]

    def put(self, layer: int, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        """One layer's stacked experts (any device/dtype) into a dense bank."""
        if self.fmt != DENSE:
            raise ValueError("this bank holds NVFP4 rows: use put_rows")
        gu, dn = split_rows(self.layer_rows(layer), self.cfg)
        gu.copy_(gate_up)
        dn.copy_(down)

    def put_rows(self, layer: int, rows: torch.Tensor) -> None:
        """One layer's experts as ready rows [E, row bytes] (NVFP4: packed bytes; or already at the bank's
        stride) of the bank's dtype; the padding to the stride is zeros."""
        dst = self.layer_rows(layer)
        if (rows.dim() != 2 or rows.shape[0] != dst.shape[0] or rows.shape[1] not in (self.packed_elems, dst.shape[1])
                or rows.dtype != dst.dtype):
            raise ValueError(f"layer {layer}: rows {tuple(rows.shape)} {rows.dtype} do not match the bank's "
                             f"{tuple(dst.shape)} {dst.dtype}")
        dst[:, :rows.shape[1]].copy_(rows)
        if rows.shape[1] < dst.shape[1]:
            dst[:, rows.shape[1]:].zero_()

    @property
    def row_bytes(self) -> int:
        return self.row_elems * self.dtype.itemsize
