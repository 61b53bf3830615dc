"""scripts/profile_decode.py's arms: which can share the first arm's model (--share-model: switches read at launch
only, the same decode_kernels value), and that every such name is an arm switch or value it knows."""
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import profile_decode as pd  # noqa: E402


def test_arms_share_the_model_only_over_switches_read_at_launch():
    assert pd.shares_model("fused-pdl/gugroups+dnroute", "fused-pdl")
    assert pd.shares_model("fused-pdl/gubn=2+no-dngroups", "fused-pdl/fp8mma+mmastages=8")
    assert pd.shares_model("fused-pdl/mixedfew+dnpre", "fused-pdl")  # gemv_two_formats reads it at each call
    assert not pd.shares_model("fused/gugroups", "fused-pdl")  # another decode_kernels value
    assert not pd.shares_model("fused-pdl/mixed", "fused-pdl")  # gemv_mixed.MIXED: read as parts are split
    assert not pd.shares_model("fused-pdl/gugroups", "fused-pdl/drop-route")  # a ceiling: not a launch switch


def test_every_launch_time_name_is_a_known_switch_or_value():
    assert pd.AT_LAUNCH <= set(pd.SWITCHES) | set(pd.VALUES)
