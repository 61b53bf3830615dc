"""The small fused kernels of the batch-1 decode step, in one place to import from. Each replaces a chain of
torch kernels of a few microseconds each (launch-bound at batch 1), and has its torch reference beside it:

  add_rms_norm        residual add + zero-centred RMSNorm           (kernels/decode_norm.py)
  sigmoid_gate_mul    attention output * sigmoid(gate)              (kernels/decode_norm.py)
  route_topk          router softmax + top-k + renormalise + shared-expert sigmoid   (kernels/decode_router.py)
  attention_prologue  q/gate split, q/k head norms, partial RoPE, v (kernels/attention_prologue.py)
"""
from .attention_prologue import attention_prologue, attention_prologue_reference, rope_inv_freq  # noqa: F401
from .decode_norm import (add_rms_norm, add_rms_norm_reference, sigmoid_gate_mul,  # noqa: F401
                          sigmoid_gate_mul_reference)
from .decode_router import route_topk, route_topk_reference  # noqa: F401
