#!/usr/bin/env python3
"""Prefill attention of one long prompt at the model's geometry (16 q heads, 2 KV heads, head_dim 256, bf16),
chunk by chunk as layer-major prefill calls it: FlashInfer's paged prefill over pages of 16 (what the engine
runs), its ragged prefill over the same cache read as contiguous rows (one sequence owns its pages in order, so
the pages are rows 0..kv_len-1), each with the FA3 (sm_90) and FA2 backends, and the paged FA3 kernel over pairs
of chunks in one call (attention batching, seed 003). A benchmark, not a test: prints a table.

Each row: the GPU time of one prompt's attention for one layer (the sum over its chunks of the median of
--repeat timed calls), TFLOP/s on the causal FLOPs, the ratio to the paged FA3 row, and whether its outputs are
byte-equal to the paged FA3 row's (max abs difference otherwise).

    python scripts/bench_prefill_attention.py [--tokens 122880] [--chunk 8192]
"""
from __future__ import annotations

import argparse
import statistics

import torch

HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 2, 256, 16
WORKSPACE = 128 << 20


def causal_flops(start: int, rows: int) -> float:
    """QK^T and PV of rows queries at positions start.. over their causal KV: 4 * heads * head_dim per pair."""
    return 4.0 * HEADS * HEAD_DIM * (rows * start + rows * (rows + 1) / 2)


class Paged:
    def __init__(self, flashinfer, backend: str, k_pages, v_pages):
        self.w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
            torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), kv_layout="NHD", backend=backend)
        self.kv = (k_pages, v_pages)
        self.indices = torch.arange(k_pages.shape[0], dtype=torch.int32)

    def plan(self, start: int, rows: int) -> None:
        kv_len = start + rows
        pages = -(-kv_len // PAGE)
        self.w.plan(torch.tensor([0, rows], dtype=torch.int32), torch.tensor([0, pages], dtype=torch.int32),
                    self.indices[:pages], torch.tensor([kv_len - (pages - 1) * PAGE], dtype=torch.int32),
                    HEADS, KV_HEADS, HEAD_DIM, PAGE, causal=True, q_data_type=torch.bfloat16,
                    kv_data_type=torch.bfloat16)

    def run(self, q):
        return self.w.run(q, self.kv)


class Ragged:
    def __init__(self, flashinfer, backend: str, k_pages, v_pages):
        self.w = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(
            torch.empty(WORKSPACE, dtype=torch.uint8, device="cuda"), kv_layout="NHD", backend=backend)
        self.k, self.v = (t.view(-1, KV_HEADS, HEAD_DIM) for t in (k_pages, v_pages))

    def plan(self, start: int, rows: int) -> None:
        self.w.plan(torch.tensor([0, rows], dtype=torch.int32), torch.tensor([0, start + rows], dtype=torch.int32),
                    HEADS, KV_HEADS, HEAD_DIM, causal=True, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
        self.kv_len = start + rows

    def run(self, q):
        return self.w.run(q, self.k[: self.kv_len], self.v[: self.kv_len])


def time_calls(arm, groups, qs, repeat: int) -> tuple[float, list[torch.Tensor]]:
    """Sum over groups of the median GPU time of one call (ms) and the outputs, split back into chunks."""
    total, outs = 0.0, []
    for start, rows, members in groups:
        q = torch.cat([qs[i] for i in members]) if len(members) > 1 else qs[members[0]]
        arm.plan(start, rows)
        out = arm.run(q)  # warm (JIT on the first call) and the output kept
        times = []
        for _ in range(repeat):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            arm.run(q)
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        total += statistics.median(times)
        outs.extend(out.split([qs[i].shape[0] for i in members]))
    return total, outs


def main() -> None:
    import flashinfer

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=122880)
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--arms", default="paged-fa3,ragged-fa3,paged-fa3-pairs,ragged-fa3-pairs,paged-fa2,ragged-fa2,paged-fa2-pairs")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    pages = -(-args.tokens // PAGE)
    k_pages = torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    v_pages = torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    bounds = [(s, min(args.chunk, args.tokens - s)) for s in range(0, args.tokens, args.chunk)]
    qs = [torch.randn(rows, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16) for _, rows in bounds]
    singles = [(s, r, (i,)) for i, (s, r) in enumerate(bounds)]
    pairs = [(bounds[i][0], sum(r for _, r in bounds[i:i + 2]), tuple(range(i, min(i + 2, len(bounds)))))
             for i in range(0, len(bounds), 2)]
    flops = sum(causal_flops(s, r) for s, r in bounds)
    make = {"paged": Paged, "ragged": Ragged}
    print(f"prefill attention, one layer: {args.tokens:,} tokens in {len(bounds)} chunks of {args.chunk:,}; "
          f"{flops / 1e12:.1f} TFLOP causal; {torch.cuda.get_device_name()}")
    print(f"{'arm':18} {'ms/layer':>9} {'TFLOP/s':>8} {'vs first':>8}  outputs vs the first arm", flush=True)
    ref = None
    for name in args.arms.split(","):  # each row printed when measured: a timeout keeps the rows before it
        kind, backend, *rest = name.split("-")
        try:
            arm = make[kind](flashinfer, backend, k_pages, v_pages)
            ms, outs = time_calls(arm, pairs if rest == ["pairs"] else singles, qs, args.repeat)
        except Exception as exc:  # a backend this build or GPU lacks: say so, go on
            print(f"{name:18} {'-':>9} {'-':>8} {'-':>8}  failed: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
            continue
        if ref is None:
            ref = (ms, outs)
        same = all(torch.equal(a, b) for a, b in zip(outs, ref[1]))
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in zip(outs, ref[1]))
        note = "byte-equal" if same else f"max diff {diff:.3g}"
        print(f"{name:18} {ms:9.2f} {flops / ms / 1e9:8.1f} {ms / ref[0]:8.3f}  {note}", flush=True)

if __name__ == "__main__":
    main()
