#!/usr/bin/env python3
"""Batch-1 decode attention at the model's geometry (16 q heads, 2 KV heads, head_dim 256, bf16, pages of 16):
FlashInfer's CUDA-core decode kernel (what the engine runs) against its tensor-core path (use_tensor_cores=True,
the fa2 prefill kernel for one query), timed (a benchmark, not a test). Prints a table.

Each row: microseconds per call (a CUDA graph of --inner calls, each on its own KV cache so that the 50 MB L2
does not hold the pages between calls; median over --repeat replays), the KV bytes one call must read, GB/s,
and the max difference to the CUDA-core output (0 means byte-equal). --triton: also the engine's Triton split-KV
kernel (kernels/attention_decode.py) at its default launch config and at --configs (splits/stages/block_t/warps),
over contiguous KV rows, its difference taken to the fp32 reference; and, at --apart configs, the fused step's two
forms with the output gate: the in-launch merge + sigmoid_gate_mul ("merged+gate") against the partials + the
merge in the gate's launch ("apart+merge", attention_merge.py, MERGE_APART), two launches each, each one's
difference to the fp32 reference times the gate.

    python scripts/bench_attention_decode.py [--lengths 16384,120000]
    python scripts/bench_attention_decode.py --triton --no-flashinfer
"""
from __future__ import annotations

import argparse
import math
import statistics

import torch

HEADS, KV_HEADS, HEAD_DIM, PAGE = 16, 2, 256, 16


def wrapper(flashinfer, kv_pages: int, tensor_cores: bool):
    indptr = torch.zeros(2, dtype=torch.int32, device="cuda")
    indices = torch.arange(kv_pages, dtype=torch.int32, device="cuda")
    last = torch.zeros(1, dtype=torch.int32, device="cuda")
    return flashinfer.CUDAGraphBatchDecodeWithPagedKVCacheWrapper(
        torch.empty(128 << 20, dtype=torch.uint8, device="cuda"), indptr, indices, last, kv_layout="NHD",
        use_tensor_cores=tensor_cores)


def main() -> None:
    import flashinfer

    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="16384,120000")
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--triton", action="store_true", help="also the engine's Triton kernel over its configs")
    ap.add_argument("--no-flashinfer", action="store_true")
    ap.add_argument("--configs", default="64/3/64/4,128/2/64/4,128/3/32/4,256/2/32/4,256/3/32/4,128/2/64/8,"
                                         "64/2/64/8,128/3/64/4,256/2/64/4,512/2/32/4")
    ap.add_argument("--apart", default="64/3/64/4,128/3/64/4,128/3/32/4,32/3/64/4,256/2/32/4",
                    help="splits/stages/block_t/warps of the two gated forms (with --triton; '' for none)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'kv_len':>7} {'kernel':12} {'us/call':>8} {'MB':>7} {'GB/s':>7} {'max diff':>9}")
    for kv_len in (int(s) for s in args.lengths.split(",")):
        pages = math.ceil(kv_len / PAGE)
        caches = [(torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16),
                   torch.randn(pages, PAGE, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16))
                  for _ in range(args.inner)]
        q = torch.randn(1, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
        mb = 2 * kv_len * KV_HEADS * HEAD_DIM * 2 / 1e6
        baseline = None
        if args.triton:
            triton_rows(kv_len, args, gen)
        for name, tc in (() if args.no_flashinfer else (("cuda-core", False), ("tensor-core", True))):
            w = wrapper(flashinfer, pages, tc)
            w.plan(torch.tensor([0, pages], dtype=torch.int32), torch.arange(pages, dtype=torch.int32),
                   torch.tensor([kv_len - (pages - 1) * PAGE], dtype=torch.int32), HEADS, KV_HEADS, HEAD_DIM,
                   PAGE, pos_encoding_mode="NONE", q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)
            outs = [w.run(q, kv) for kv in caches]  # warm-up (JIT)
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side):
                outs = [w.run(q, kv) for kv in caches]
            times = []
            for _ in range(args.repeat):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                graph.replay()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b) * 1e3 / args.inner)
            us = statistics.median(times)
            out = outs[0].float()
            diff = 0.0 if baseline is None else (out - baseline).abs().max().item()
            baseline = out if baseline is None else baseline
            print(f"{kv_len:>7} {name:12} {us:8.1f} {mb:7.1f} {mb * 1e-3 / (us * 1e-6):7.0f} {diff:9.2e}")


def triton_rows(kv_len: int, args, gen) -> None:
    """The engine's Triton decode attention (PDL off: one kernel alone) at each config, its KV as rows."""
    from bench_nvfp4_experts_decode import graph_timed  # scripts/ is on the path when this runs as a script
    from qwenlocal.engine.kernels.attention_decode import decode_attention, decode_attention_reference
    from qwenlocal.engine.kernels.launch import new_counter

    caches = [(torch.randn(kv_len, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16),
               torch.randn(kv_len, KV_HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16))
              for _ in range(args.inner)]
    q = torch.randn(1, HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    pos = torch.tensor([kv_len - 1], device="cuda")
    ref = decode_attention_reference(q, *caches[0], kv_len - 1)
    mb = 2 * kv_len * KV_HEADS * HEAD_DIM * 2 / 1e6
    for cfg in args.configs.split(","):
        splits, stages, block_t, warps = (int(v) for v in cfg.split("/"))
        counters = new_counter(q.device, KV_HEADS * (splits // 8 + 1))
        kw = dict(splits=splits, group=8, block_t=block_t, num_warps=warps, num_stages=stages)
        try:
            out = decode_attention(q, *caches[0], pos, counters, **kw)
            us = 1e6 * graph_timed([lambda c=c: decode_attention(q, *c, pos, counters, **kw) for c in caches],
                                   args.repeat, True)
        except Exception as exc:  # a config that does not fit (shared memory): say so
            print(f"{kv_len:>7} triton {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
            continue
        diff = (out.float() - ref).abs().max().item()
        print(f"{kv_len:>7} {'triton ' + cfg:18} {us:8.1f} {mb:7.1f} {mb * 1e-3 / (us * 1e-6):7.0f} {diff:9.2e}",
              flush=True)
    gate = torch.randn(HEADS, HEAD_DIM, device="cuda", generator=gen).to(torch.bfloat16)
    gated_ref = (ref.reshape(HEADS, HEAD_DIM).to(torch.bfloat16).float() * torch.sigmoid(gate).float()).reshape(1, -1)
    for cfg in filter(None, args.apart.split(",")):
        splits, stages, block_t, warps = (int(v) for v in cfg.split("/"))
        for form, call in gated_forms(q, pos, gate, splits, stages, block_t, warps).items():
            try:
                out = call(caches[0])
                us = 1e6 * graph_timed([lambda c=c: call(c) for c in caches], args.repeat, True)
            except Exception as exc:  # a config that does not fit (shared memory): say so
                print(f"{kv_len:>7} {form} {cfg}: {type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
                continue
            diff = (out.float().reshape(1, -1) - gated_ref).abs().max().item()
            print(f"{kv_len:>7} {form + ' ' + cfg:18} {us:8.1f} {mb:7.1f} {mb * 1e-3 / (us * 1e-6):7.0f} "
                  f"{diff:9.2e}", flush=True)


def gated_forms(q, pos, gate, splits: int, stages: int, block_t: int, warps: int) -> dict:
    """The fused step's attention + output gate, two launches each way: {name: call(kv cache) -> gated output}."""
    from qwenlocal.engine.kernels.attention_decode import decode_attention, decode_attention_parts
    from qwenlocal.engine.kernels.attention_merge import merge_gate
    from qwenlocal.engine.kernels.decode_norm import sigmoid_gate_mul
    from qwenlocal.engine.kernels.launch import new_counter

    forms = {"apart+merge": lambda c: merge_gate(*decode_attention_parts(q, *c, pos, splits=splits, block_t=block_t,
                                                                         num_warps=warps, num_stages=stages),
                                                 gate, torch.bfloat16)}
    if splits % 8 == 0:
        counters = new_counter(q.device, KV_HEADS * (splits // 8 + 1))
        forms["merged+gate"] = lambda c: sigmoid_gate_mul(
            decode_attention(q, *c, pos, counters, splits=splits, group=8, block_t=block_t, num_warps=warps,
                             num_stages=stages), gate)
    return forms


if __name__ == "__main__":
    main()
