"""The ways to bring missed experts from the pinned host bank into GPU slots, in GB/s (a benchmark, not a test).

  per-miss copy  one cudaMemcpyAsync per expert (needs the miss list on the host: not graph-capturable with
                 a device-side count)
  gather kernel  engine/kernels/expert_copy.py: Triton reads the mapped pinned bank (zero-copy), device-side
                 ids and count, capturable (what the decode step uses)
  one block copy k contiguous rows in one copy: the link's ceiling for the same bytes (not a real gather)
Rows of the real sizes: BF16 experts (6,291,456 B) and NVFP4 experts (1,769,484 B padded to 1,781,760 B in
the probe's figure). Random distinct source rows; the median of `--reps` timed runs, CUDA events.
    python scripts/bench_expert_copy.py --out docs/results
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from bench_resident import timed  # scripts/ is on sys.path when this runs as a script
from qwenlocal.engine.kernels.expert_copy import gather_experts

ROWS = {"bf16": 6_291_456, "nvfp4": 1_781_760}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--bank-rows", type=int, default=512)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    dev = torch.device("cuda")
    results = []
    for fmt, row_bytes in ROWS.items():
        elems = row_bytes // 2
        bank = torch.empty(args.bank_rows, elems, dtype=torch.bfloat16, pin_memory=True)
        bank.view(torch.int16).random_(-30000, 30000)
        slots = torch.empty(64 + 1, elems, dtype=torch.bfloat16, device=dev)
        for k in (8, 28, 46):
            gen = torch.Generator().manual_seed(k)
            src = torch.randperm(args.bank_rows, generator=gen)[:k]
            dst = torch.randperm(64, generator=gen)[:k]
            src_d, dst_d = src.to(dev), dst.to(dev)
            count = torch.tensor([k], device=dev)
            pairs = list(zip(src.tolist(), dst.tolist()))

            def per_miss():
                for s, d in pairs:
                    slots[d].copy_(bank[s], non_blocking=True)

            def gather():
                gather_experts(bank, src_d, dst_d, count, slots)

            block_src = bank[:k]

            def block():
                slots[:k].copy_(block_src, non_blocking=True)

            gather()
            torch.cuda.synchronize()
            assert all(torch.equal(slots[d].cpu().view(torch.int16), bank[s].view(torch.int16)) for s, d in pairs), \
                "gather kernel copied wrong bytes"
            nbytes = k * row_bytes
            row = {"format": fmt, "row_bytes": row_bytes, "experts": k, "bytes": nbytes}
            for name, fn in (("per_miss_copy", per_miss), ("gather_kernel", gather), ("one_block_copy", block)):
                s = timed(fn, args.reps)
                row[name + "_s"], row[name + "_gbps"] = s, nbytes / s / 1e9
            results.append(row)
            print(f"{fmt:6} k={k:3} {nbytes / 1e6:7.1f} MB  per-miss {row['per_miss_copy_gbps']:5.1f} GB/s  "
                  f"gather {row['gather_kernel_gbps']:5.1f} GB/s  one-block {row['one_block_copy_gbps']:5.1f} GB/s",
                  flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{time.strftime('%Y-%m-%d-%H%M%S')}-expert-copy.json"
        path.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "reps": args.reps, "results": results}, indent=1))
        print("result:", path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
