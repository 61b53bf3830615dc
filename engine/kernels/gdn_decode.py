"""The whole GatedDeltaNet decode step of one token, after the in-projections, in one or two Triton launches.

Fuses, for one token: the causal depthwise conv1d (+ SiLU) over mixed_qkv with its conv state, the split into
q / k / v heads, the fp32 L2 norms of q and k (q scaled by K^-0.5), beta = sigmoid(b), g = -exp(A_log) *
softplus(a + dt_bias), the gated delta rule on the fp32 recurrent state [Hv, K, V] (S *= exp(g); delta =
(v - S^T k) * beta; S += k delta^T; o = S^T q), and the gated RMSNorm of o with z (weight w, not 1 + w).
conv_state and state are updated in place (a captured decode graph keeps reading the same buffers).
Reference: gdn_decode_step_reference, built from what model/gdn.GatedDeltaNet.forward runs for t = 1
(gdn_torch.causal_conv1d, gdn_torch.gdn_core_torch(decode=True), model/ops.rms_norm_gated).

Dtypes follow the model's unfused path: the compute dtype is conv_state's; inputs given in fp32 are first
rounded to it (as the model's linear returns it), the conv and SiLU results, sigmoid(b), o and the norm's
intermediate products are rounded to it where torch rounds them. Values are rounded to bf16 by hand
(_round), since Triton's interpreter truncates in .to(tl.bfloat16) while the GPU and torch round to nearest.

The conv state race, and the two launch plans (one_launch=):
  Several programs need the conv of the same q/k channels (value heads h and h' share key head h // rep,
  and V-tiles of one head share all of its q/k), and the shift overwrites the old inputs the conv reads. No
  program may shift a channel while another may still read it, so each plan makes one owner shift each channel
  after every read of it has been made:
  - two launches (default): gdn_step_kernel on a (Hv, V / block_v) grid only READS the conv state (each
    program recomputes the conv of its head's q/k, a few KB from L2) and writes o, rounded, to a scratch
    buffer; gdn_norm_shift_kernel (Hv programs) then applies the gated RMSNorm per head and shifts the conv
    state, each channel by exactly one program. The big kernel gets Hv * V / block_v programs.
  - one launch: gdn_step_kernel on a (Hk,) grid, one program per KEY head doing all its rep value heads and
    the whole of V, so it is the only reader of its q/k/v channels; it shifts them itself after a barrier
    (its own threads' reads done) and applies the norm before its one store. Only Hk programs (16 here),
    each holding rep x K x V fp32 of state.
  Inside one program the shift loads [c, j + 1] and stores [c, j] from different threads, so it loads every
  new value, then tl.debug_barrier(), then stores (_shift_conv_state). Deterministic: no atomics, fixed
  reduction order for a given launch config, which is a pure function of the shapes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .launch import gdc_prologue, last_to_arrive, pdl_launch
from ..model.ops import rms_norm_gated
from .gdn_torch import causal_conv1d, gdn_core_torch

_DT = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}


@triton.jit
def _round(x, DT: tl.constexpr):
    """fp32 -> the dtype coded DT (0 fp32, 1 bf16, 2 fp16) -> fp32, to nearest even (by hand for bf16)."""
    if DT == 1:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
        y = bits.to(tl.float32, bitcast=True)
    elif DT == 2:
        y = x.to(tl.float16).to(tl.float32)
    else:
        y = x
    return y


@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _softplus(x):
    # torch's softplus (beta 1, threshold 20) with an accurate log1p: log(w) * u / (w - 1), w = 1 + u.
    u = tl.exp(x)
    w = 1.0 + u
    tiny = w == 1.0
    log1p = tl.where(tiny, u, tl.log(w) * (u / tl.where(tiny, 1.0, w - 1.0)))
    return tl.where(x > 20.0, x, log1p)


@triton.jit
def _conv_silu(x_ptr, cs_ptr, cw_ptr, ch, mask, cs_stride, cw_stride, W: tl.constexpr, DT: tl.constexpr):
    """silu(causal conv1d) of the channels ch from the OLD conv state: taps [state | x], summed in order. One
    [A, B] load per tap, no tap axis, so these small tensors take whatever layout the state tile wants."""
    acc = tl.zeros(ch.shape, dtype=tl.float32)
    for j in tl.static_range(W - 1):
        w = _round(tl.load(cw_ptr + ch * cw_stride + j, mask=mask, other=0.0).to(tl.float32), DT)
        acc += w * tl.load(cs_ptr + ch * cs_stride + j, mask=mask, other=0.0).to(tl.float32)
    x = _round(tl.load(x_ptr + ch, mask=mask, other=0.0).to(tl.float32), DT)
    acc += _round(tl.load(cw_ptr + ch * cw_stride + (W - 1), mask=mask, other=0.0).to(tl.float32), DT) * x
    return _round(_silu(_round(acc, DT)), DT)


@triton.jit
def _shift_conv_state(x_ptr, cs_ptr, ch, mask, cs_stride, W: tl.constexpr, WF: tl.constexpr, DT: tl.constexpr):
    """conv_state[ch] = [state[ch, 1:], x[ch]] in place. Every new value is loaded before the barrier and stored
    after it: another thread of this program may load [c, j + 1] while this one stores [c, j]."""
    j = tl.arange(0, WF)[None, None, :]
    c3, m3 = ch[:, :, None], mask[:, :, None]
    later = tl.load(cs_ptr + c3 * cs_stride + j + 1, mask=m3 & (j < W - 2), other=0.0)
    x = _round(tl.load(x_ptr + ch, mask=mask, other=0.0).to(tl.float32), DT)
    new = tl.where(j == W - 2, x[:, :, None].to(later.dtype), later)
    tl.debug_barrier()
    tl.store(cs_ptr + c3 * cs_stride + j, new, mask=m3 & (j < W - 1))


@triton.jit
def _gated_rms_norm(o, zr, w, mask, V, eps, DT: tl.constexpr, WDT: tl.constexpr):
    """rms_norm_gated on o [A, BV] (already rounded to DT), per row over the V valid columns."""
    o = tl.where(mask, o, 0.0)
    inv = 1.0 / tl.sqrt(tl.sum(o * o, axis=1) / V + eps)
    y = _round(_round(o * inv[:, None], DT) * w, WDT)
    return _round(y * _silu(zr), DT)


@triton.jit
def gdn_step_kernel(
    qkv_ptr, z_ptr, b_ptr, a_ptr, cs_ptr, cw_ptr, nega_ptr, dtb_ptr, state_ptr, normw_ptr, o_ptr,
    cs_stride, cw_stride, key_dim, K, V, REP, HEADS_PER, scale, eps, out_ptr, counters_ptr,
    W: tl.constexpr, WF: tl.constexpr, HP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    ONE_LAUNCH: tl.constexpr, DT: tl.constexpr, WDT: tl.constexpr,
    USE_GDC: tl.constexpr = False, TAIL: tl.constexpr = False, BVF: tl.constexpr = 16, FENCE: tl.constexpr = False,
    EARLY: tl.constexpr = False,
):
    """Program (p, t): value heads p * HEADS_PER + [0, HEADS_PER) (all of one key head's if ONE_LAUNCH, else
    one), V columns [t * BV, t * BV + BV). o_ptr: the output (ONE_LAUNCH, normed) or the o scratch. TAIL (one
    head a program): gdn_norm_shift's work in this launch, by the last programs to arrive (_norm_shift_tail).
    EARLY: the state tile is loaded before the PDL wait (see EARLY_STATE), from L2 past L1."""
    if not EARLY:
        gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    pid, pid_v = tl.program_id(0), tl.program_id(1)
    r = tl.arange(0, HP)
    heads = pid * HEADS_PER + r
    hmask = r < HEADS_PER
    kh = (pid * HEADS_PER) // REP
    offs_k = tl.arange(0, BK)
    kmask = offs_k < K
    offs_v = pid_v * BV + tl.arange(0, BV)
    vmask = offs_v < V

    # The state tile first: its loads are the long pole and depend on nothing.
    s_off = heads[:, None, None] * (K * V) + offs_k[None, :, None] * V + offs_v[None, None, :]
    s_mask = hmask[:, None, None] & kmask[None, :, None] & vmask[None, None, :]
    if EARLY:  # only this launch writes the state (the previous step's, long complete): read it before the wait
        s = tl.load(state_ptr + s_off, mask=s_mask, other=0.0, cache_modifier=".cg")
        gdc_prologue(USE_GDC)  # in_proj's outputs (q, k, v, z, b, a) are read only after this
    else:
        s = tl.load(state_ptr + s_off, mask=s_mask, other=0.0)

    q_ch = (kh * K + offs_k)[None, :]
    q = _conv_silu(qkv_ptr, cs_ptr, cw_ptr, q_ch, kmask[None, :], cs_stride, cw_stride, W, DT)
    k = _conv_silu(qkv_ptr, cs_ptr, cw_ptr, q_ch + key_dim, kmask[None, :], cs_stride, cw_stride, W, DT)
    q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=1) + 1e-6))[:, None] * scale  # [1, BK]
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=1) + 1e-6))[:, None]
    hv = heads[:, None] * V + offs_v[None, :]  # [HP, BV]: the value channels' index within value_dim
    hv_mask = hmask[:, None] & vmask[None, :]
    v = _conv_silu(qkv_ptr, cs_ptr, cw_ptr, 2 * key_dim + hv, hv_mask, cs_stride, cw_stride, W, DT)

    b = _round(tl.load(b_ptr + heads, mask=hmask, other=0.0).to(tl.float32), DT)
    beta = _round(1.0 / (1.0 + tl.exp(-b)), DT)
    a = _round(tl.load(a_ptr + heads, mask=hmask, other=0.0).to(tl.float32), DT)
    dt_bias = tl.load(dtb_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
    g = tl.load(nega_ptr + heads, mask=hmask, other=0.0).to(tl.float32) * _softplus(a + dt_bias)

    k3, q3 = k[:, :, None], q[:, :, None]
    s = s * tl.exp(g)[:, None, None]
    delta = (v - tl.sum(s * k3, axis=1)) * beta[:, None]
    s = s + k3 * delta[:, None, :]
    tl.store(state_ptr + s_off, s, mask=s_mask)
    o = _round(tl.sum(s * q3, axis=1), DT)  # [HP, BV]

    if ONE_LAUNCH:
        # The only reader of these channels: shift them now (the barrier inside orders our own reads first).
        _shift_conv_state(qkv_ptr, cs_ptr, q_ch, kmask[None, :], cs_stride, W, WF, DT)
        _shift_conv_state(qkv_ptr, cs_ptr, q_ch + key_dim, kmask[None, :], cs_stride, W, WF, DT)
        _shift_conv_state(qkv_ptr, cs_ptr, 2 * key_dim + hv, hv_mask, cs_stride, W, WF, DT)
        zr = _round(tl.load(z_ptr + hv, mask=hv_mask, other=0.0).to(tl.float32), DT)
        w = tl.load(normw_ptr + offs_v, mask=vmask, other=0.0).to(tl.float32)[None, :]
        o = _gated_rms_norm(o, zr, w, hv_mask, V, eps, DT, WDT)
    tl.store(o_ptr + hv, o, mask=hv_mask)
    if TAIL:
        _norm_shift_tail(qkv_ptr, z_ptr, o_ptr, normw_ptr, out_ptr, cs_ptr, counters_ptr, cs_stride, key_dim, K,
                         V, REP, pid, kh, eps, tl.num_programs(0), tl.num_programs(1), W, WF, BK, BVF, DT, WDT,
                         FENCE)


@triton.jit
def _head_norm(z_ptr, o_ptr, normw_ptr, out_ptr, h, V, eps, BV: tl.constexpr, DT: tl.constexpr, WDT: tl.constexpr):
    """Value head h's gated RMSNorm from the o scratch into out; -> (offs_v [1, BV], its mask)."""
    offs_v = tl.arange(0, BV)[None, :]
    vmask = offs_v < V
    o = tl.load(o_ptr + h * V + offs_v, mask=vmask, other=0.0).to(tl.float32)
    zr = _round(tl.load(z_ptr + h * V + offs_v, mask=vmask, other=0.0).to(tl.float32), DT)
    w = tl.load(normw_ptr + offs_v, mask=vmask, other=0.0).to(tl.float32)
    tl.store(out_ptr + h * V + offs_v, _gated_rms_norm(o, zr, w, vmask, V, eps, DT, WDT), mask=vmask)
    return offs_v, vmask


@triton.jit
def _norm_shift_tail(qkv_ptr, z_ptr, o_ptr, normw_ptr, out_ptr, cs_ptr, counters_ptr, cs_stride, key_dim, K, V,
                     REP, h, kh, eps, HV, TILES, W: tl.constexpr, WF: tl.constexpr, BK: tl.constexpr,
                     BVF: tl.constexpr, DT: tl.constexpr, WDT: tl.constexpr, FENCE: tl.constexpr):
    """Value head h's last V-tile program: head h's gated RMSNorm from the o scratch into out, and the shift of
    its v channels (only its own tiles read them); then, the last of key head kh's REP value heads: the shift of
    kh's q and k channels (read by all of those heads' tiles). Counters: [HV] per value head, then [Hk] per key
    head, 0 between launches. Every channel is shifted by one program, after every read of it has arrived."""
    if last_to_arrive(counters_ptr + h, TILES, FENCE):
        offs_v, vmask = _head_norm(z_ptr, o_ptr, normw_ptr, out_ptr, h, V, eps, BVF, DT, WDT)
        _shift_conv_state(qkv_ptr, cs_ptr, 2 * key_dim + h * V + offs_v, vmask, cs_stride, W, WF, DT)
        if last_to_arrive(counters_ptr + HV + kh, REP, FENCE):
            offs_k = tl.arange(0, BK)[None, :]
            kmask = offs_k < K
            _shift_conv_state(qkv_ptr, cs_ptr, kh * K + offs_k, kmask, cs_stride, W, WF, DT)
            _shift_conv_state(qkv_ptr, cs_ptr, key_dim + kh * K + offs_k, kmask, cs_stride, W, WF, DT)


@triton.jit
def gdn_norm_shift_kernel(
    qkv_ptr, z_ptr, o_ptr, normw_ptr, out_ptr, cs_ptr, cs_stride, conv_dim, V, ch_per, eps,
    W: tl.constexpr, WF: tl.constexpr, BV: tl.constexpr, BCH: tl.constexpr, DT: tl.constexpr, WDT: tl.constexpr,
    USE_GDC: tl.constexpr = False,
):
    """Program h: the gated RMSNorm of head h's o (scratch) into out, and the shift of conv channels
    [h * ch_per, h * ch_per + ch_per): every channel by exactly one program, after every read of it."""
    gdc_prologue(USE_GDC)  # PDL: nothing is read before the previous kernel ends
    h = tl.program_id(0)
    _head_norm(z_ptr, o_ptr, normw_ptr, out_ptr, h, V, eps, BV, DT, WDT)

    c = tl.arange(0, BCH)[None, :]
    ch = h * ch_per + c
    _shift_conv_state(qkv_ptr, cs_ptr, ch, (c < ch_per) & (ch < conv_dim), cs_stride, W, WF, DT)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """A 1-D unit-stride view (the merged GEMV's slices are), else a contiguous copy."""
    x = x.reshape(-1)
    return x if x.stride(0) == 1 else x.contiguous()


# gdn_norm_shift's work as the step kernel's tail (decode_fused passes the counters): off until its GPU A/B
# (profile_decode arm "gdntail"); the same bytes in the interpreter.
NORM_SHIFT_TAIL = False


# The step kernel's state tile (16 KB a program at the real geometry, the kernel's long pole) loaded before its PDL
# wait, so that its DRAM latency overlaps in_proj's last programs instead of following them. Sound: the state is
# written only by this launch (each program its own tile), the previous step's launch completed before the in_proj
# launch ahead of this one passed its own wait, and the loads go past L1 (.cg), which may hold an older step's line.
# The same values, so the same bytes. Off until its GPU A/B (profile_decode arm "gdnearly"); the two-launch plan.
EARLY_STATE = False


# V columns a gdn_step program: 32 gives the real geometry (Hv 32, V 128) 128 programs of 16 KB of state, one an
# SM (Nsight Compute: 6 % warp occupancy, 0.24 waves, the warps waiting on memory). More programs do not help:
# profile_decode arms gdnbv=16 / gdnbv=8 were 1.012x / 1.026x the step (docs/RESULTS.md session 18): each
# program's chain (its q/k conv and norms, then the state update) sets the time, not the bytes in flight.
BLOCK_V = 32


def default_config(num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int) -> dict:
    """The launch parameters gdn_decode_step uses unless told: a pure function of the shapes (and BLOCK_V)."""
    return dict(one_launch=False, block_v=min(BLOCK_V, triton.next_power_of_2(v_dim)), num_warps=4, norm_warps=4)


def gdn_decode_step(
    mixed_qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
    conv_w: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, norm_w: torch.Tensor,
    eps: float, num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int, out: torch.Tensor | None = None, *,
    one_launch: bool | None = None, block_v: int | None = None, num_warps: int | None = None,
    norm_warps: int | None = None, counters: torch.Tensor | None = None, norm_shift: bool = True,
) -> torch.Tensor:
    """One decode token: mixed_qkv [conv_dim], z [Hv*V], b, a [Hv] (compute dtype or fp32; unit-stride views
    are fine) -> out [Hv*V] in the compute dtype (= conv_state.dtype). Updates conv_state [conv_dim, W-1] and
    the fp32 state [Hv, K, V] in place. conv_w [conv_dim, W] (or [conv_dim, 1, W]); neg_a = -exp(A_log),
    dt_bias [Hv]; norm_w [V]. No host syncs (CUDA-graph safe). Launch keywords default to default_config.
    counters (launch.new_counter(device, Hv + Hk)): with the two-launch plan, the norm and the shift as the
    step kernel's tail (one launch; the same bytes in the interpreter, the norm's sum by the step's warps on a
    GPU) instead of gdn_norm_shift_kernel. norm_shift=False (diagnostics only: decode_fused.DROP's
    "normshift" ceiling): the two-launch plan's step kernel alone, its unnormed o returned, the conv state not
    shifted (wrong bytes)."""
    hk, hv, kd, vd = num_k_heads, num_v_heads, k_dim, v_dim
    key_dim, dtype = hk * kd, conv_state.dtype
    conv_dim = 2 * key_dim + hv * vd
    width = conv_state.shape[1] + 1
    conv_w = conv_w.reshape(conv_dim, width)
    assert hv % hk == 0 and mixed_qkv.numel() == conv_dim and z.numel() == hv * vd
    assert b.numel() == hv and a.numel() == hv and norm_w.numel() == vd and width >= 2
    assert conv_state.shape == (conv_dim, width - 1) and conv_state.stride(1) == 1 and conv_w.stride(1) == 1
    assert state.shape == (hv, kd, vd) and state.dtype == torch.float32 and state.is_contiguous()
    cfg = default_config(hk, hv, kd, vd)
    given = dict(one_launch=one_launch, block_v=block_v, num_warps=num_warps, norm_warps=norm_warps)
    cfg.update({k: v for k, v in given.items() if v is not None})
    if out is None:
        out = torch.empty(hv * vd, device=state.device, dtype=dtype)
    assert out.numel() == hv * vd and out.dtype == dtype and out.is_contiguous()
    qkv, z, b, a, norm_w = _flat(mixed_qkv), _flat(z), _flat(b), _flat(a), _flat(norm_w)
    neg_a, dt_bias = _flat(neg_a), _flat(dt_bias)
    dt = _DT[dtype]
    wdt = _DT[torch.promote_types(dtype, norm_w.dtype)]
    rep, bk, wf = hv // hk, triton.next_power_of_2(kd), triton.next_power_of_2(width)
    common = (conv_state.stride(0), conv_w.stride(0), key_dim, kd, vd, rep)
    if cfg["one_launch"]:
        gdn_step_kernel[(hk, 1)](
            qkv, z, b, a, conv_state, conv_w, neg_a, dt_bias, state, norm_w, out, *common, rep, kd ** -0.5, eps,
            out, out, W=width, WF=wf, HP=triton.next_power_of_2(rep), BK=bk, BV=triton.next_power_of_2(vd),
            ONE_LAUNCH=True, DT=dt, WDT=wdt, num_warps=cfg["num_warps"], **pdl_launch(state.device))
        return out
    bv = cfg["block_v"]
    o = torch.empty(hv * vd, device=state.device, dtype=dtype)
    if counters is not None and (counters.dtype != torch.int32 or counters.numel() != hv + hk
                                 or counters.device != state.device):
        raise ValueError(f"counters must be launch.new_counter(device, {hv + hk}): one int32 a value head and "
                         f"one a key head")
    gdn_step_kernel[(hv, triton.cdiv(vd, bv))](
        qkv, z, b, a, conv_state, conv_w, neg_a, dt_bias, state, norm_w, o, *common, 1, kd ** -0.5, eps,
        out, counters if counters is not None else out,
        W=width, WF=wf, HP=1, BK=bk, BV=bv, ONE_LAUNCH=False, DT=dt, WDT=wdt, num_warps=cfg["num_warps"],
        TAIL=counters is not None, BVF=triton.next_power_of_2(vd), FENCE=state.device.type == "cuda",
        EARLY=EARLY_STATE, **pdl_launch(state.device))
    if counters is not None:
        return out
    if not norm_shift:
        return o
    ch_per = triton.cdiv(conv_dim, hv)
    gdn_norm_shift_kernel[(hv,)](
        qkv, z, o, norm_w, out, conv_state, conv_state.stride(0), conv_dim, vd, ch_per, eps,
        W=width, WF=wf, BV=triton.next_power_of_2(vd), BCH=triton.next_power_of_2(ch_per), DT=dt, WDT=wdt,
        num_warps=cfg["norm_warps"], **pdl_launch(state.device))
    return out


def gdn_decode_step_reference(
    mixed_qkv: torch.Tensor, z: torch.Tensor, b: torch.Tensor, a: torch.Tensor, conv_state: torch.Tensor,
    conv_w: torch.Tensor, neg_a: torch.Tensor, dt_bias: torch.Tensor, state: torch.Tensor, norm_w: torch.Tensor,
    eps: float, num_k_heads: int, num_v_heads: int, k_dim: int, v_dim: int, out: torch.Tensor | None = None, *,
    core=gdn_core_torch,
) -> torch.Tensor:
    """gdn_decode_step in torch: GatedDeltaNet.forward's steps for t = 1 after the projections (inputs first
    rounded to the compute dtype, conv_state.dtype, as the model's linear returns them). core: the gated delta
    rule, gdn_core_torch or gdn_fla.gdn_core_fla (the engine's current decode path on a GPU)."""
    dtype, key_dim = conv_state.dtype, num_k_heads * k_dim
    width = conv_state.shape[1] + 1
    x = mixed_qkv.reshape(-1).to(dtype)
    mixed, new_conv = causal_conv1d(x[:, None], conv_w.reshape(x.numel(), width).to(dtype), conv_state)
    conv_state.copy_(new_conv)
    q, k, v = torch.split(mixed[:, 0], [key_dim, key_dim, num_v_heads * v_dim])
    q, k = q.reshape(1, num_k_heads, k_dim), k.reshape(1, num_k_heads, k_dim)
    v = v.reshape(1, num_v_heads, v_dim)
    beta = torch.sigmoid(b.reshape(1, -1).to(dtype)).float()
    g = neg_a.reshape(1, -1) * F.softplus(a.reshape(1, -1).to(dtype).float() + dt_bias.reshape(1, -1))
    o, new_state = core(q, k, v, g, beta, state, True)
    state.copy_(new_state)
    gate = z.reshape(1, num_v_heads, v_dim).to(dtype)
    result = rms_norm_gated(o.to(dtype), gate, norm_w, eps).reshape(-1)
    if out is None:
        return result
    return out.copy_(result)
