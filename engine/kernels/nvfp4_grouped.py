"""Grouped prefill MoE over native NVFP4 expert rows (W4A16): the prefill counterpart of nvfp4_moe_decode.

Same flow as moe_triton.moe_grouped: align_pairs sorts the (token, k) pairs by expert on the device (no host
sync) and pads each expert's run to BLOCK_M; a gate_up kernel writes act = SiLU(gate x) * (up x) per pair, a
down kernel writes the pair's output times its routing weight in fp32, and the k outputs of a token are summed
in slot order (deterministic, no atomics). The difference: the weight tile is decoded from the row's bytes
(layout in nvfp4_triton.pack_nvfp4_expert) inside the K loop.

Element 2j of a row sits in the low nibble of byte j, so instead of interleaving the decoded nibbles, each K
block is two tl.dot calls: the even activation columns times the low-nibble tile plus the odd columns times
the high-nibble tile. E2M1 * E4M3 has at most 6 significant bits, so the decoded tile is exact in bf16/fp16
and the tensor cores see exactly the checkpoint's values; the fp32 global scales are applied after the K loop.

Every M block decodes its expert's whole weight once, so the decode cost per FLOP falls as 1/BLOCK_M: the
launch configuration (GroupedConfig) grows BLOCK_M with the average pairs per expert (choose_config), and the
decode is integer bit moves into fp16 bit patterns (no exp2). scripts/bench_nvfp4_grouped.py times a grid of
configs against the BF16 grouped kernel.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .moe_triton import LARGE_FROM, align_pairs
from ..quant.nvfp4_rows import unpack_nvfp4_expert  # noqa: F401 (re-exported for the tests)
from .nvfp4_triton import nvfp4_expert_row_bytes, nvfp4_row_parts
from .pair_sum import pair_sum


@dataclass(frozen=True)
class GroupedConfig:
    """Launch configuration of nvfp4_moe_grouped. gu_* tile the gate_up kernel (N over inter, K over hidden),
    dn_* the down kernel (N over hidden, K over inter); tiles are clamped to the problem's size at launch.
    split_a: load each activation tile contiguously and split it into even/odd columns in registers (else two
    stride-2 loads). group_scales: load one E4M3 scale per 16 weights and broadcast it (else one per byte).
    num_warps/num_stages are ignored by the interpreter."""
    block_m: int = 32
    gu_block_n: int = 64
    gu_block_k: int = 128
    dn_block_n: int = 64
    dn_block_k: int = 128
    num_warps: int = 4
    num_stages: int = 3
    split_a: bool = True
    group_scales: bool = True

    def validate(self) -> "GroupedConfig":
        pow2 = {"block_m": (self.block_m, 16), "gu_block_n": (self.gu_block_n, 16), "dn_block_n": (self.dn_block_n, 16),
                # BLOCK_K >= 32: each half-dot has K = BLOCK_K/2 >= 16 for tl.dot, and no scale group is split
                "gu_block_k": (self.gu_block_k, 32), "dn_block_k": (self.dn_block_k, 32),
                "num_warps": (self.num_warps, 1)}
        for name, (v, low) in pow2.items():
            if v < low or v & (v - 1):
                raise ValueError(f"GroupedConfig.{name} must be a power of two >= {low}, got {v}")
        if self.num_stages < 1:
            raise ValueError(f"GroupedConfig.num_stages must be >= 1, got {self.num_stages}")
        return self

    def label(self) -> str:
        return (f"m{self.block_m} gu{self.gu_block_n}x{self.gu_block_k} dn{self.dn_block_n}x{self.dn_block_k} "
                f"w{self.num_warps} s{self.num_stages}" + ("" if self.split_a else " strided-a")
                + ("" if self.group_scales else " byte-scales"))


def choose_config(num_pairs: int, num_experts: int, gpu: bool, large: bool = False) -> GroupedConfig:
    """The default launch configuration, a pure function of the problem.

    Cost of one M block ~ D + BLOCK_M * c (D: decoding the expert's weight tile by tile, paid once per block;
    c: the MMA per pair), and an expert with n pairs runs ceil(n / BLOCK_M) blocks. With D worth ~64-160 rows
    of MMA on sm_90 (integer decode, the decoded tile's trip through shared memory), the expected cost under
    uniform (Poisson) routing is lowest for 32-row blocks below ~28 pairs per expert, 64 up to ~64, 128 above:
    so avg < 28 -> 32, < 64 -> 64, else 128 (the engine's 2048-token chunk over 256 experts, top-8: 64 pairs
    per expert -> 128). 128-row blocks take 8 warps (two warpgroups: each gate/up accumulator [128, 64] is
    32 registers a thread); the down kernel's single accumulator affords BLOCK_N 128 there. The interpreter
    (gpu=False) gets 64-wide tiles: less masked waste on tiny shapes.
    large (the engine option moe_prefill_blocks=large, on a GPU): from LARGE_FROM pairs an expert (the 8,192-token
    chunk has 256), 256-row blocks with the narrow tiles whose sm_90 code has no spills, one scale byte a load:
    each weight tile decoded once an expert instead of twice (0.92x the 128-row config's time at 8,192 tokens on
    the H200, scripts/bench_nvfp4_grouped.py, docs/RESULTS.md session 13; not yet paired in the engine)."""
    avg = num_pairs / max(1, num_experts)
    if large and gpu and avg >= LARGE_FROM:
        return GroupedConfig(block_m=256, gu_block_n=32, gu_block_k=64, dn_block_n=64, dn_block_k=64,
                             num_warps=8, num_stages=3, group_scales=False)
    block_m = 32 if avg < 28 else 64 if avg < 64 else 128
    if not gpu:
        return GroupedConfig(block_m=block_m, gu_block_n=64, gu_block_k=64, dn_block_n=64, dn_block_k=64)
    if block_m == 128:
        return GroupedConfig(block_m=128, gu_block_n=64, gu_block_k=128, dn_block_n=128, dn_block_k=64,
                             num_warps=8, num_stages=3)
    return GroupedConfig(block_m=block_m, gu_block_n=64, gu_block_k=128, dn_block_n=64, dn_block_k=128,
                         num_warps=4, num_stages=3)


@triton.jit
def _e2m1_f16x(code):
    """E2M1 code (int32, 0..15) -> its value * 2^-14 as fp32: s e e m placed as fp16 bits s at 15, e e m at
    11..9 is 2^(e-15) * (1 + m/2) (subnormal 2^-14 * m/2 at e == 0), i.e. the value times 2^-14. Exact."""
    bits = ((code & 8) << 12) | ((code & 7) << 9)
    return bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _e4m3_x2p14(bits):
    """E4M3 bits (int32) -> value * 2^14 as fp32, so that _e2m1_f16x(c) * this = e2m1 * e4m3 exactly: s eeee mmm
    as fp16 bits s at 15, eeee at 13..10, mmm at 9..7 is the value * 2^-8 (same subnormals, bias 15 vs 7).
    The NaN pattern never appears in block scales."""
    h = ((bits & 128) << 8) | ((bits & 127) << 7)
    return h.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32) * 4194304.0  # 2^22 = 2^8 * 2^14


@triton.jit
def _nvfp4_tile(w_ptr, s_ptr, n64, mask_n, k_in, k0, dtype: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_SCALES: tl.constexpr):
    """(low, high) nibble tiles [BLOCK_K/2, BLOCK_N] of dequant(W[n, k0:k0+BLOCK_K]).T without the global
    scale, for a [*, k_in] NVFP4 matrix (packed bytes at w_ptr, E4M3 scale bytes at s_ptr). k_in is a multiple
    of 16 and BLOCK_K of 32, so both nibbles of a byte share one 16-element scale group and masking whole
    groups is exact. Masked bytes decode to 0, so padding contributes nothing."""
    if GROUP_SCALES:  # [G, 8, N] bytes times a [G, 1, N] scale, one scale load per 16 weights
        grp = k0 // 16 + tl.arange(0, BLOCK_K // 16)
        mask = (grp < k_in // 16)[:, None] & mask_n[None, :]
        sc_bits = tl.load(s_ptr + n64[None, :] * (k_in // 16) + grp[:, None], mask=mask, other=0)
        sc = _e4m3_x2p14(sc_bits.to(tl.int32))[:, None, :]
        byte = (grp * 8)[:, None, None] + tl.arange(0, 8)[None, :, None]
        packed = tl.load(w_ptr + n64[None, None, :] * (k_in // 2) + byte, mask=mask[:, None, :],
                         other=0).to(tl.int32)
        lo = tl.reshape((_e2m1_f16x(packed & 15) * sc).to(dtype), [BLOCK_K // 2, BLOCK_N])
        hi = tl.reshape((_e2m1_f16x(packed >> 4) * sc).to(dtype), [BLOCK_K // 2, BLOCK_N])
        return lo, hi
    else:  # [K/2, N] bytes, each with its own (repeated) scale byte
        half = tl.arange(0, BLOCK_K // 2)
        mask = (k0 // 2 + half < k_in // 2)[:, None] & mask_n[None, :]
        packed = tl.load(w_ptr + n64[None, :] * (k_in // 2) + (k0 // 2 + half)[:, None], mask=mask,
                         other=0).to(tl.int32)
        sc_bits = tl.load(s_ptr + n64[None, :] * (k_in // 16) + ((k0 + 2 * half) // 16)[:, None], mask=mask,
                          other=0)
        sc = _e4m3_x2p14(sc_bits.to(tl.int32))
        return (_e2m1_f16x(packed & 15) * sc).to(dtype), (_e2m1_f16x(packed >> 4) * sc).to(dtype)


@triton.jit
def _a_tile(ptr, rows64, valid, k_in, k0, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_A: tl.constexpr):
    """(even, odd) columns [BLOCK_M, BLOCK_K/2] of A[rows, k0:k0+BLOCK_K] for a row-major [*, k_in] A."""
    if SPLIT_A:  # one contiguous (vectorizable) load, de-interleaved in registers
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(ptr + rows64[:, None] * k_in + kk[None, :], mask=valid[:, None] & (kk < k_in)[None, :],
                    other=0.0)
        return tl.split(tl.reshape(a, [BLOCK_M, BLOCK_K // 2, 2]))
    else:
        half = tl.arange(0, BLOCK_K // 2)
        mask = valid[:, None] & (k0 + 2 * half < k_in)[None, :]
        cols = rows64[:, None] * k_in + (k0 + 2 * half)[None, :]
        return tl.load(ptr + cols, mask=mask, other=0.0), tl.load(ptr + cols + 1, mask=mask, other=0.0)


@triton.jit
def _dot(a, w, acc, FP32_DOT: tl.constexpr):
    if FP32_DOT:  # fp32 inputs, or any dtype in the interpreter: exact fp32 products
        # (Triton 3.6's interpreter matmuls bf16 as its raw uint16 bits; bf16*bf16 is exact in fp32, so the
        # upcast computes what the tensor cores do, up to the order of the fp32 sums.)
        return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    else:  # bf16/fp16 on the GPU: tensor cores, fp32 accumulation
        return tl.dot(a, w, acc)


@triton.jit
def nvfp4_grouped_gate_up_kernel(
    x_ptr, pair_ids_ptr, block_expert_ptr, rows_ptr, act_ptr, num_pairs, H, I, TOP_K, E, row_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
    SPLIT_A: tl.constexpr, GROUP_SCALES: tl.constexpr,
):
    # 1-D grid, N blocks fastest: the CTAs that run together share their pairs' activation rows (L2) and
    # read one expert's weight.
    pid = tl.program_id(0)
    num_n = tl.cdiv(I, BLOCK_N)
    pid_b = pid // num_n
    pid_n = pid % num_n
    # align_pairs sorts by id, so a block's id is the row (expert or cache slot) all its pairs read.
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:  # block past the last padded run: nothing to do
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    base = rows_ptr + e * row_stride
    scales, _, _, globals_ = nvfp4_row_parts(base, H, I)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < I
    gate_rows, up_rows = n.to(tl.int64), (n + I).to(tl.int64)
    dtype = x_ptr.dtype.element_ty
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        a_even, a_odd = _a_tile(x_ptr, tokens, valid, H, k0, BLOCK_M, BLOCK_K, SPLIT_A)
        g_lo, g_hi = _nvfp4_tile(base, scales, gate_rows, mask_n, H, k0, dtype, BLOCK_N, BLOCK_K, GROUP_SCALES)
        acc_g = _dot(a_odd, g_hi, _dot(a_even, g_lo, acc_g, FP32_DOT), FP32_DOT)
        u_lo, u_hi = _nvfp4_tile(base, scales, up_rows, mask_n, H, k0, dtype, BLOCK_N, BLOCK_K, GROUP_SCALES)
        acc_u = _dot(a_odd, u_hi, _dot(a_even, u_lo, acc_u, FP32_DOT), FP32_DOT)
    g = acc_g * tl.load(globals_)  # gate and up share the block scales but not the global scale
    u = acc_u * tl.load(globals_ + 1)
    h = g / (1.0 + tl.exp(-g)) * u
    tl.store(act_ptr + pairs[:, None].to(tl.int64) * I + n[None, :], h.to(act_ptr.dtype.element_ty),
             mask=valid[:, None] & mask_n[None, :])


@triton.jit
def nvfp4_grouped_down_kernel(
    act_ptr, pair_ids_ptr, block_expert_ptr, wts_ptr, rows_ptr, out_ptr, num_pairs, H, I, E, row_stride,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FP32_DOT: tl.constexpr,
    SPLIT_A: tl.constexpr, GROUP_SCALES: tl.constexpr,
):
    pid = tl.program_id(0)
    num_n = tl.cdiv(H, BLOCK_N)
    pid_b = pid // num_n
    pid_n = pid % num_n
    e = tl.load(block_expert_ptr + pid_b).to(tl.int64)
    if e >= E:
        return
    pairs = tl.load(pair_ids_ptr + pid_b * BLOCK_M + tl.arange(0, BLOCK_M))
    valid = pairs < num_pairs
    p64 = pairs.to(tl.int64)
    base = rows_ptr + e * row_stride
    _, down, scales, globals_ = nvfp4_row_parts(base, H, I)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = n < H
    n64 = n.to(tl.int64)
    dtype = act_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        a_even, a_odd = _a_tile(act_ptr, p64, valid, I, k0, BLOCK_M, BLOCK_K, SPLIT_A)
        w_lo, w_hi = _nvfp4_tile(down, scales, n64, mask_n, I, k0, dtype, BLOCK_N, BLOCK_K, GROUP_SCALES)
        acc = _dot(a_odd, w_hi, _dot(a_even, w_lo, acc, FP32_DOT), FP32_DOT)
    wt = tl.load(wts_ptr + p64, mask=valid, other=0.0).to(tl.float32)
    acc = acc * tl.load(globals_ + 2) * wt[:, None]
    tl.store(out_ptr + p64[:, None] * H + n64[None, :], acc, mask=valid[:, None] & mask_n[None, :])


def _clamp(block: int, size: int, low: int) -> int:
    """A configured tile no larger than the problem needs (power of two >= low)."""
    return min(block, max(low, triton.next_power_of_2(size)))


def resolve_config(num_pairs: int, num_experts: int, gpu: bool,
                   config: GroupedConfig | dict | None = None, block_m: int | None = None,
                   large: bool = False) -> GroupedConfig:
    """config None -> choose_config (its large rule where large); a dict -> choose_config's choice with those
    fields replaced; a GroupedConfig as given. block_m (the older keyword) overrides the block size last."""
    if config is None or isinstance(config, dict):
        base = choose_config(num_pairs, num_experts, gpu, large)
        config = dataclasses.replace(base, **config) if config else base
    if block_m is not None:
        config = dataclasses.replace(config, block_m=block_m)
    return config.validate()


def nvfp4_moe_grouped(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                      hidden: int, inter: int, block_m: int | None = None,
                      config: GroupedConfig | dict | None = None, large_blocks: bool = False) -> torch.Tensor:
    """x [T, H], weights/ids [T, k] (ids index rows), rows uint8 [E, >= row bytes] -> [T, H] in x.dtype.
    config: see resolve_config (None: choose_config's default for this many pairs per expert; large_blocks: its
    large-block rule, the engine's moe_prefill_blocks=large)."""
    if hidden % 16 or inter % 16:
        raise ValueError(f"NVFP4 needs hidden and inter to be multiples of 16, got {hidden}, {inter}")
    if rows.dtype != torch.uint8 or rows.dim() != 2 or rows.stride(1) != 1 \
            or rows.shape[1] < nvfp4_expert_row_bytes(hidden, inter):
        raise ValueError(f"rows must be uint8 [E, >= {nvfp4_expert_row_bytes(hidden, inter)}] with unit inner stride")
    if rows.stride(0) % 4:  # the kernels read the fp32 globals at the row's end as aligned 4-byte words
        raise ValueError(f"rows' row stride must be a multiple of 4 bytes, got {rows.stride(0)}")
    t, k = ids.shape
    e = rows.shape[0]
    num_pairs = t * k
    gpu = x.device.type == "cuda"
    cfg = resolve_config(num_pairs, e, gpu, config, block_m, large_blocks)
    ids_flat = ids.reshape(-1).contiguous()
    pair_ids, block_expert = align_pairs(ids_flat, e, cfg.block_m)
    num_blocks = block_expert.shape[0]
    fp32_dot = x.dtype == torch.float32 or not gpu  # see _dot
    launch = dict(BLOCK_M=cfg.block_m, FP32_DOT=fp32_dot, SPLIT_A=cfg.split_a, GROUP_SCALES=cfg.group_scales,
                  num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    # act in x's dtype: the down kernel's dot then runs on the tensor cores in bf16, like moe_grouped.
    act = torch.empty(num_pairs, inter, device=x.device, dtype=x.dtype)
    block_n, block_k = _clamp(cfg.gu_block_n, inter, 16), _clamp(cfg.gu_block_k, hidden, 32)
    nvfp4_grouped_gate_up_kernel[(num_blocks * triton.cdiv(inter, block_n),)](
        x.contiguous(), pair_ids, block_expert, rows, act, num_pairs, hidden, inter, k, e, rows.stride(0),
        BLOCK_N=block_n, BLOCK_K=block_k, **launch,
    )
    pair_out = torch.empty(num_pairs, hidden, device=x.device, dtype=torch.float32)
    block_n, block_k = _clamp(cfg.dn_block_n, hidden, 16), _clamp(cfg.dn_block_k, inter, 32)
    nvfp4_grouped_down_kernel[(num_blocks * triton.cdiv(hidden, block_n),)](
        act, pair_ids, block_expert, weights.reshape(-1).contiguous(), rows, pair_out, num_pairs,
        hidden, inter, e, rows.stride(0), BLOCK_N=block_n, BLOCK_K=block_k, **launch,
    )
    # Sum the k expert outputs of each token in slot order, rounded once: deterministic, no atomics, one launch.
    return pair_sum(pair_out, t, k, x.dtype)


def dequant_nvfp4_rows(rows: torch.Tensor, hidden: int, inter: int, dtype: torch.dtype = torch.bfloat16,
                       chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """Dequantize a whole bank of NVFP4 rows at once (torch, `chunk` experts at a time) into moe_grouped's
    layout: gate_up [E, 2I, H] (gate rows first) and down [E, H, I] in dtype. Same values as
    quant.formats.dequant_nvfp4 on each unpacked part, rounded once to dtype."""
    from ..quant.formats import e2m1_table

    h, i = hidden, inter
    e = rows.shape[0]
    sizes = [2 * i * h // 2, 2 * i * h // 16, h * i // 2, h * i // 16, 12]
    offs = [0]
    for s in sizes:
        offs.append(offs[-1] + s)
    table = e2m1_table(rows.device)
    gate_up = torch.empty(e, 2 * i, h, device=rows.device, dtype=dtype)
    down = torch.empty(e, h, i, device=rows.device, dtype=dtype)

    def part(r, packed_at, scale_at, out_n, in_k, glob):  # r [c, row bytes] -> [c, out_n, in_k] fp32
        c = r.shape[0]
        packed = r[:, offs[packed_at]:offs[packed_at + 1]].reshape(c, out_n, in_k // 2)
        codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(c, out_n, in_k).long()
        scale = r[:, offs[scale_at]:offs[scale_at + 1]].contiguous().view(torch.float8_e4m3fn).float()
        block = scale.reshape(c, out_n, in_k // 16, 1).expand(c, out_n, in_k // 16, 16).reshape(c, out_n, in_k)
        return table[codes] * block * glob

    for s in range(0, e, chunk):
        r = rows[s:s + chunk, :offs[-1]]
        c = r.shape[0]
        g = r[:, offs[4]:offs[5]].contiguous().view(torch.float32).reshape(c, 3)
        glob_gu = torch.cat([g[:, 0:1].expand(c, i), g[:, 1:2].expand(c, i)], dim=1)[:, :, None]
        gate_up[s:s + c] = part(r, 0, 1, 2 * i, h, glob_gu).to(dtype)
        down[s:s + c] = part(r, 2, 3, h, i, g[:, 2, None, None]).to(dtype)
    return gate_up, down


def random_nvfp4_rows(experts: int, hidden: int, inter: int, device=None, generator: torch.Generator | None = None,
                      scale_bits: tuple[int, int] | None = None) -> torch.Tensor:
    """Synthetic rows for tests and benches, fast at any size: uniform random E2M1 codes (every byte value),
    E4M3 block scales uniform in [0.25, 2) (or, with scale_bits=(lo, hi), uniform raw bytes in [lo, hi) minus
    the NaN patterns), global scales ~ 1 / (3 sqrt(fan-in)) so that outputs stay O(1). Made on the generator's
    device (the default generator's: `device`), then moved to `device`."""
    h, i = hidden, inter
    where = generator.device if generator is not None else device
    sizes = [2 * i * h // 2, 2 * i * h // 16, h * i // 2, h * i // 16]

    def scales(n):
        if scale_bits is None:
            u = torch.rand(experts, n, generator=generator, device=where) * 1.75 + 0.25
            return u.to(torch.float8_e4m3fn).view(torch.uint8)
        b = torch.randint(scale_bits[0], scale_bits[1], (experts, n), generator=generator, dtype=torch.int32,
                          device=where)
        return torch.where((b & 127) == 127, b - 1, b).to(torch.uint8)

    def codes(n):
        return torch.randint(0, 256, (experts, n), generator=generator, dtype=torch.int32,
                             device=where).to(torch.uint8)

    parts = [codes(sizes[0]), scales(sizes[1]), codes(sizes[2]), scales(sizes[3])]
    g = torch.tensor([1 / (3 * h ** 0.5), 1 / (3 * h ** 0.5), 1 / (3 * i ** 0.5)], device=where)
    g = g * (0.5 + torch.rand(experts, 3, generator=generator, device=where))
    parts.append(g.contiguous().view(torch.uint8))
    rows = torch.cat(parts, dim=1)
    assert rows.shape[1] == nvfp4_expert_row_bytes(h, i)
    return rows.to(device)


def nvfp4_moe_grouped_reference(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, rows: torch.Tensor,
                                hidden: int, inter: int) -> torch.Tensor:
    """float32 torch reference: out = sum_k w_k * down(SiLU(gate x) * up x), each used expert dequantized from
    its row with quant.formats.dequant_nvfp4. Returns float32 [T, H]."""
    from ..quant.formats import dequant_nvfp4

    xf = x.float()
    out = torch.zeros(x.shape[0], hidden, device=x.device, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        gate, up, down = (dequant_nvfp4(*q) for q in unpack_nvfp4_expert(rows[e], hidden, inter))
        tok, slot = torch.where(ids == e)
        h = torch.nn.functional.silu(xf[tok] @ gate.T) * (xf[tok] @ up.T)
        out.index_add_(0, tok, (h @ down.T) * weights[tok, slot, None].float())
    return out
