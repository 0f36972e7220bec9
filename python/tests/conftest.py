"""Shared fixtures. The tests import the installed package (pip install .); with FP8PROJ_PYTHON_LIB
set they also run from the source tree (PYTHONPATH=python)."""
import pytest
import torch

import fp8proj


def tiny_deepseek_v3_config(**kw):
    from transformers import DeepseekV3Config
    args = dict(vocab_size=256, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=128,
                kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64,
                first_k_dense_replace=8, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1)
    args.update(kw)
    return DeepseekV3Config(**args)


@pytest.fixture
def gpu():
    ok, why = fp8proj.cuda_status()
    if not ok:
        pytest.skip(f"needs a Hopper GPU and the CUDA build of libfp8proj_c: {why}")
    return torch.device("cuda")
