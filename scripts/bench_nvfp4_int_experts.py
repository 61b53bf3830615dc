#!/usr/bin/env python3
"""The experts' gate/up alone: expert_gate_up (the default, 2 rows x 4 warps; and at 1 warp) against
nvfp4_int_experts.expert_gate_up_int (x quantized once, outside the timing; quantize_x16 timed apart) over its
launch configs, at the real geometry (hidden 2048, inter 512, 256 expert rows, 8 routed + the shared expert,
bf16 x). A CUDA graph of --inner calls, each on its own routed ids and shared expert so that L2 does not keep the
weights between calls, the median of --repeat replays, in interleaved rounds; prints us a call, GB/s, the ratio
to the default per round and each arm's act against the fp32 reference. The CPU: a small shape (interpreter).

    python scripts/bench_nvfp4_int_experts.py [--rounds 3] [--configs 2/1,4/1,1/1,2/2,4/2]
"""
from __future__ import annotations

import argparse

import torch

from bench_nvfp4_experts_decode import random_linear  # scripts/ is on the path when this runs as a script
from bench_nvfp4_int_dot import rounds_table
from qwenlocal.engine.kernels.nvfp4_experts_decode import expert_gate_up, expert_gate_up_reference
from qwenlocal.engine.kernels.nvfp4_grouped import random_nvfp4_rows
from qwenlocal.engine.kernels.nvfp4_int_dot import quantize_x16, tables
from qwenlocal.engine.kernels.nvfp4_int_experts import expert_gate_up_int


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--inner", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--configs", default="2/1,4/1,1/1,2/2,4/2", help="block_n/num_warps of expert_gate_up_int")
    args = ap.parse_args()
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    h, i, e, k = (2048, 512, 256, 8) if cuda else (64, 32, 8, 3)
    inner = args.inner if cuda else 2
    gen = torch.Generator(device=dev).manual_seed(0)
    rows = random_nvfp4_rows(e, h, i, dev, gen)
    x = torch.randn(1, h, generator=gen, device=dev).to(torch.bfloat16)
    xq = quantize_x16(x.reshape(-1))
    tables(dev)  # made before any capture
    cases = []
    for _ in range(inner):
        ids = torch.randperm(e, generator=gen, device=dev)[:k].reshape(1, k)
        cases.append((ids, random_linear(i, h, dev, gen) + random_linear(i, h, dev, gen)))
    nbytes = (k + 1) * (2 * i * h // 2 + 2 * i * h // 16)
    arms = {"expert_gate_up 2/4": lambda c: expert_gate_up(x, c[0], rows, h, i, c[1]),
            "expert_gate_up 2/1": lambda c: expert_gate_up(x, c[0], rows, h, i, c[1], block_n=2, num_warps=1)}
    for cfg in args.configs.split(","):
        bn, nw = (int(v) for v in cfg.split("/"))
        arms[f"int {bn}/{nw}"] = lambda c, bn=bn, nw=nw: expert_gate_up_int(x, c[0], rows, h, i, c[1], xq=xq,
                                                                              block_n=bn, num_warps=nw)
    ref = expert_gate_up_reference(x, cases[0][0], rows, h, i, cases[0][1])
    for name, fn in arms.items():
        err = float((fn(cases[0]) - ref).abs().max() / ref.abs().max())
        print(f"{name:<20} max |diff| / max |act| = {err:.2e}", flush=True)
    # The routed experts alone at 1 x 1: 8 / 9 of the bytes in 4,096 one-warp programs, one H200 wave (32 a SM),
    # where the 4,608 with the shared expert are 1.09 waves: if this takes much less than 8 / 9 of "int 1/1", the
    # last partial wave is what costs (the wave is not in its GB/s column, which counts all nine experts' bytes)
    arms["int 1/1 no shared"] = lambda c: expert_gate_up_int(x, c[0], rows, h, i, None, xq=xq, block_n=1,
                                                             num_warps=1)
    err = float((arms["int 1/1 no shared"](cases[0]) - ref[:k]).abs().max() / ref.abs().max())
    print(f"{'int 1/1 no shared':<20} max |diff| / max |act| = {err:.2e} (the routed rows)", flush=True)
    arms["quantize_x16 alone"] = lambda c: quantize_x16(x.reshape(-1))
    rounds_table({name: [lambda c=c, fn=fn: fn(c) for c in cases] for name, fn in arms.items()}, args.rounds,
                 args.repeat, cuda, nbytes)


if __name__ == "__main__":
    main()
