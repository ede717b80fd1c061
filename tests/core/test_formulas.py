"""The formulas against the documents' own numbers (arithmetic in the comments)."""
import math

import pytest

from tunekit.core import formulas as f


def test_macs_and_flops():
    assert f.macs_to_flops(50) == 100          # 1 MAC = 2 FLOPs
    assert f.flops_to_macs(100) == 50          # 100 FLOPs of MACs = 50 MACs
    assert f.matmul_flops(64, 256, 1024) == 33554432  # 2*64*256*1024


def test_tflops_estimate_matches_the_documents_perl_example():
    # ms=52 B, seqlen=2048, gbs=1024, 127 s/iteration, 64 GPUs, factor 4 (checkpointing):
    # 52*4*2*2048*1024 / (127*64*1e3) = 872415232 / 8128000 = 107.3345...
    assert f.estimate_tflops(52, 2048, 1024, 127, 64) == pytest.approx(872415232 / 8128000)
    assert f.estimate_tflops(52, 2048, 1024, 127, 64) == pytest.approx(107.3345, abs=1e-4)
    # without recomputation the factor is 3: 3/4 of it
    assert f.estimate_tflops(52, 2048, 1024, 127, 64, recompute=False) == pytest.approx(80.5009, abs=1e-4)


def test_train_flops_per_token():
    # nanoGPT 124M-style: N=85e6, L=12, h=768, s=1024
    # 6N = 510e6; attention 12*12*768*1024 = 113246208, causal half = 56623104
    assert f.train_flops_per_token(85e6, 12, 768, 1024, causal=False) == 510e6 + 113246208
    assert f.train_flops_per_token(85e6, 12, 768, 1024) == 510e6 + 56623104
    # full recompute: 8N + 4/3 of the attention term = 680e6 + 75497472
    assert f.train_flops_per_token(85e6, 12, 768, 1024, recompute=True) == 680e6 + 75497472


def test_forward_flops_per_token_is_a_third_of_training():
    # 2N = 170e6; forward attention 4*12*768*1024 = 37748736, causal half = 18874368
    assert f.forward_flops_per_token(85e6, 12, 768, 1024) == 170e6 + 18874368
    assert f.forward_flops_per_token(85e6, 12, 768, 1024, causal=False) == 170e6 + 37748736
    assert 3 * f.forward_flops_per_token(85e6, 12, 768, 1024) == f.train_flops_per_token(85e6, 12, 768, 1024)


def test_inference_flops_per_layer():
    # 24*B*s*h^2 + 4*B*s^2*h with B=2, s=512, h=768: 24*2*512*589824 + 4*2*262144*768
    assert f.inference_flops_per_layer(2, 512, 768) == 14495514624 + 1610612736


def test_mfu_hfu_from_the_documents():
    # H100 bf16 dense peak 989 TFLOPS; 400 TFLOPS achieved -> 40.4% (the document prints "0.40%")
    assert f.utilization(400e12, 1.0, 989) == pytest.approx(0.40445, abs=1e-5)
    # Megatron-LM 22B on A100: MFU 41.5% of 312 = 129.48 TFLOPS of model FLOPs
    assert f.utilization(129.48e12, 1.0, 312) == pytest.approx(0.415)
    assert math.isnan(f.utilization(1e12, 1.0, None))
    assert math.isnan(f.tflops(1e12, 0))


def test_batch_arithmetic():
    assert f.data_parallel_size(64, tp=4, pp=2) == 8     # 64 / (4*2)
    assert f.global_batch_size(4, dp=8, grad_accum=16) == 512  # 4*8*16
    with pytest.raises(ValueError, match="do not split"):
        f.data_parallel_size(10, tp=4)
