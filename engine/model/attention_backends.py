"""Attention backends behind one interface: a KV store per full-attention layer plus `prepare` (once per
forward, outside any CUDA graph) and `attend` (per layer, inside the graph).

- SdpaAttention: contiguous growing KV + torch SDPA. CPU, and the fallback where FlashInfer is missing.
  Not graph-safe (its shapes follow the length).
- FlashInferAttention: paged KV allocated once for the whole context (fixed addresses), FlashInfer's paged
  prefill wrapper and its CUDA-graph decode wrapper (plan outside the graph, run inside). A single sequence
  owns pages 0..n-1 in order, so page p holds positions [p*P, (p+1)*P) and a KV write is an index_copy at
  device-side positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .cache import ContiguousKV

_WORKSPACE_BYTES = 128 * 2**20  # FlashInfer's recommended plan/run workspace
_SPLIT_MARGIN = 4 * 2**20  # the plan's other float buffers and their 16-byte alignment


def prefill_workspace_bytes(backend: str, num_heads: int, num_kv_heads: int, head_dim: int, num_sm: int) -> int:
    """The prefill wrapper's float workspace. FA2 splits the KV of short chunks at a long KV into at most
    2 * SMs / kv_heads pieces and keeps every piece's partial output and softmax state in it (scheduler.cuh
    PrefillPlan: tmp_v = heads x pieces x CTA_TILE_Q (<= 128) x head_dim fp32, tmp_s the same without head_dim):
    277 MB on a 132-SM H200 and 147 MB on a 70-SM card at this model's geometry, past the 128 MiB a plan then
    fails with ("Buffer overflow ... batch_prefill_tmp_s"). FA3 never splits."""
    if backend != "fa2":
        return _WORKSPACE_BYTES
    pieces = 2 * num_sm // num_kv_heads
    tmp_v = num_heads * pieces * 128 * head_dim * 4
    return max(_WORKSPACE_BYTES, tmp_v + tmp_v // head_dim + _SPLIT_MARGIN)


def prefill_backend(device: torch.device, dtype: torch.dtype, head_dim: int) -> str:
    """The backend FlashInfer's "auto" takes for this prefill (fa3 on sm_90 where it has the head dim, else fa2)."""
    from flashinfer.utils import determine_attention_backend

    return determine_attention_backend(device, 0, False, False, dtype, dtype, head_dim_qk=head_dim,
                                       head_dim_vo=head_dim)


def sdpa_causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_start: int, scale: float) -> torch.Tensor:
    """q [T, Hq, D] at absolute positions q_start.., k/v [L, Hkv, D] for positions 0..L-1 -> [T, Hq, D]."""
    t, hq, _ = q.shape
    group = hq // k.shape[1]
    k = k.repeat_interleave(group, dim=1).transpose(0, 1)
    v = v.repeat_interleave(group, dim=1).transpose(0, 1)
    qh = q.transpose(0, 1)
    if q_start == 0 and t == k.shape[1]:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale)
    else:
        q_pos = torch.arange(q_start, q_start + t, device=q.device)
        mask = torch.arange(k.shape[1], device=q.device)[None, :] <= q_pos[:, None]
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


class SdpaAttention:
    name = "sdpa"
    graph_safe = False

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim

    def new_kv(self, dtype: torch.dtype, device: torch.device, max_len: int) -> ContiguousKV:
        return ContiguousKV(self.num_kv_heads, self.head_dim, dtype, device)

    def prepare(self, start: int, t: int, decode: bool) -> None:
        pass

    def write(self, kv: ContiguousKV, k, v, positions: torch.Tensor, start: int) -> None:
        kv.write(start, k, v)

    def attend_rows(self, kv: ContiguousKV, q, start: int, decode: bool) -> torch.Tensor:
        """Attention of q (rows start..) over a cache that already holds their k and v."""
        k_all, v_all = kv.read(start + q.shape[0])
        return sdpa_causal(q, k_all, v_all, start, self.head_dim ** -0.5)

    def attend(self, kv: ContiguousKV, q, k, v, positions: torch.Tensor, start: int, decode: bool) -> torch.Tensor:
        self.write(kv, k, v, positions, start)
        return self.attend_rows(kv, q, start, decode)

    def pair_plan(self, start: int, lengths: list[int]) -> list[tuple[int, ...]]:
        """SDPA never takes two chunks in one call (its matmul shapes, so its bytes, would change)."""
        return [(i,) for i in range(len(lengths))]


@dataclass
class PagedKV:
    k: torch.Tensor  # [pages, page_size, kv_heads, head_dim]
    v: torch.Tensor

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k.view(-1, *self.k.shape[2:]).index_copy_(0, positions, k)
        self.v.view(-1, *self.v.shape[2:]).index_copy_(0, positions, v)


def flashinfer_available() -> bool:
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return False
    return True


class FlashInferAttention:
    name = "flashinfer"
    graph_safe = True

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, max_len: int, page_size: int = 16, pairs: bool = False,
                 backend: str = "auto", prefill_kv: str = "ragged"):
        """pairs: prefill attention over two adjacent chunks in one call where that is byte-identical (the
        layer-major path asks); backend: FlashInfer's prefill backend ("auto": fa3 on sm_90, else fa2);
        prefill_kv: "ragged" = prefill reads the pages as contiguous rows (one sequence owns them in order), or
        "paged" = through the page table."""
        import flashinfer

        if prefill_kv not in ("ragged", "paged"):
            raise ValueError(f"prefill_kv must be 'ragged' or 'paged', got {prefill_kv!r}")

        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.dtype, self.device, self.page_size = dtype, device, page_size
        self.max_pages = math.ceil(max_len / page_size)
        backend = prefill_backend(device, dtype, head_dim) if backend == "auto" else backend
        num_sm = torch.cuda.get_device_properties(device).multi_processor_count
        prefill_bytes = prefill_workspace_bytes(backend, num_heads, num_kv_heads, head_dim, num_sm)
        self.workspace_bytes = prefill_bytes + _WORKSPACE_BYTES
        # Prefill and decode keep separate workspaces: a decode plan must not clobber a captured graph's data.
        # Prefill reads the KV as ragged rows: FA3 loads contiguous rows with TMA, where pages of 16 take gathers;
        # one 120K prompt's attention per layer 185.8 against 264.6 ms on the H200 (0.70x; FA2 0.94x;
        # scripts/bench_prefill_attention.py, docs/RESULTS.md session 12).
        self.prefill_kv = prefill_kv
        workspace = torch.empty(prefill_bytes, dtype=torch.uint8, device=device)
        if prefill_kv == "ragged":
            self.prefill = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(workspace, kv_layout="NHD", backend=backend)
        else:
            self.prefill = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD", backend=backend)
        self._indptr = torch.zeros(2, dtype=torch.int32, device=device)
        self._indices = torch.arange(self.max_pages, dtype=torch.int32, device=device)
        self._last = torch.zeros(1, dtype=torch.int32, device=device)
        # Tensor cores for decode: 8 query heads share each KV head (GQA), so one token's attention is a small
        # matmul per KV head. Measured on the H200 (scripts/bench_attention_decode.py, docs/RESULTS.md): 23.9 vs
        # 42.1 us at 16K and 74.9 vs 172.2 us at 120K against the CUDA-core decode kernel.
        self.decode = flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
            torch.empty(_WORKSPACE_BYTES, dtype=torch.uint8, device=device),
            self._indptr, self._indices, self._last, kv_layout="NHD", use_tensor_cores=True)
        self._host_indices = torch.arange(self.max_pages, dtype=torch.int32)
        # Why: plan() writes its metadata into a pinned host buffer and copies it to the GPU asynchronously; a
        # second plan() before that copy ran would rewrite the bytes it is about to read (an illegal memory access
        # at 64K layer-major once the MoE stopped syncing; mini-sglang#103). One event per wrapper marks the
        # previous plan's copy; the next plan waits for it, not for the whole GPU.
        self._planned = {"prefill": torch.cuda.Event(), "decode": torch.cuda.Event()}
        self.plan_guard = True  # the GPU test's negative control turns it off
        from .attention_pairs import AttentionPairs

        self.pairs = AttentionPairs(enabled=pairs)

    def new_kv(self, dtype: torch.dtype, device: torch.device, max_len: int) -> PagedKV:
        shape = (self.max_pages, self.page_size, self.num_kv_heads, self.head_dim)
        return PagedKV(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))

    def _page_table(self, kv_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indptr, indices, last page's length) of the one sequence's first kv_len positions, on the host."""
        pages = math.ceil(kv_len / self.page_size)
        return (torch.tensor([0, pages], dtype=torch.int32), self._host_indices[:pages],
                torch.tensor([kv_len - (pages - 1) * self.page_size], dtype=torch.int32))

    def prepare(self, start: int, t: int, decode: bool) -> None:
        kv_len = start + t
        planned = self._planned["decode" if decode else "prefill"]
        if self.plan_guard:
            planned.synchronize()  # returns at once before the first record
        if decode:
            indptr, indices, last = self._page_table(kv_len)
            self.decode.plan(indptr, indices, last, self.num_heads, self.num_kv_heads, self.head_dim,
                             self.page_size, pos_encoding_mode="NONE", q_data_type=self.dtype,
                             kv_data_type=self.dtype)
        elif self.prefill_kv == "ragged":  # no page table: rows 0..kv_len-1
            self.prefill.plan(torch.tensor([0, t], dtype=torch.int32), torch.tensor([0, kv_len], dtype=torch.int32),
                              self.num_heads, self.num_kv_heads, self.head_dim, causal=True,
                              q_data_type=self.dtype, kv_data_type=self.dtype)
        else:
            self.prefill.plan(torch.tensor([0, t], dtype=torch.int32), *self._page_table(kv_len), self.num_heads,
                              self.num_kv_heads, self.head_dim, self.page_size, causal=True,
                              q_data_type=self.dtype, kv_data_type=self.dtype)
        planned.record()

    def write(self, kv: PagedKV, k, v, positions: torch.Tensor, start: int) -> None:
        kv.write(positions, k, v)

    def attend_rows(self, kv: PagedKV, q, start: int, decode: bool) -> torch.Tensor:
        """Attention of q (rows start..) over a cache that already holds their k and v, with the plan `prepare`
        made for (start, len(q))."""
        if decode:
            return self.decode.run(q.contiguous(), (kv.k, kv.v))
        if self.prefill_kv == "ragged":
            end = start + q.shape[0]
            k_rows, v_rows = self.decode_rows(kv)
            return self.prefill.run(q.contiguous(), k_rows[:end], v_rows[:end])
        return self.prefill.run(q.contiguous(), (kv.k, kv.v))

    def attend(self, kv: PagedKV, q, k, v, positions: torch.Tensor, start: int, decode: bool) -> torch.Tensor:
        self.write(kv, k, v, positions, start)
        return self.attend_rows(kv, q, start, decode)

    def pair_plan(self, start: int, lengths: list[int]) -> list[tuple[int, ...]]:
        """Chunks of one prefill window (lengths, from position start) grouped for attention: adjacent pairs
        where one prefill call over both gives each chunk's own call's bytes (attention_pairs.py), else one."""
        return self.pairs.plan(self, start, lengths)

    def plan_facts(self, qo_len: int, kv_len: int):
        """The prefill plan FlashInfer makes for qo_len rows ending at kv_len, as PlanFacts (planned on the prefill
        wrapper itself, so only before a window's first real plan)."""
        from .attention_pairs import plan_facts

        self.prepare(kv_len - qo_len, qo_len, decode=False)
        return plan_facts(self.prefill, self.head_dim)

    @staticmethod
    def decode_rows(kv: PagedKV) -> tuple[torch.Tensor, torch.Tensor]:
        """The pages as rows [positions, kv_heads, head_dim] (position p is row p: one sequence owns the pages
        in order), for a decode step that writes its k and v itself (the fused attention prologue)."""
        return kv.k.view(-1, *kv.k.shape[2:]), kv.v.view(-1, *kv.v.shape[2:])

    def attend_written(self, kv: PagedKV, q: torch.Tensor) -> torch.Tensor:
        """Decode attention over a cache that already holds this step's k and v (decode_rows)."""
        return self.decode.run(q.contiguous(), (kv.k, kv.v))
