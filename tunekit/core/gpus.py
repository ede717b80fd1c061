"""Every GPU tunekit knows, one `GPU` row each (core.gpu), every figure with its source; the alias
table beside them and the default device. Pure data, no torch.

Adding a card is adding one row to `GPUS` (docs/ARCHITECTURE.md, "a GPU"): the plan, its
expectation, the peaks, the dashboard's picker and ``tunekit plan --device`` read it from there.
Read the table as ``gpus.GPUS`` at call time (never ``from ... import GPUS``): a test adds a row by
replacing it (tests/core/test_gpu_row.py). Order matters: the first row whose `match` substrings are all
in a driver's name wins, so a variant comes before its base card ("H100 SXM 96GB" before "H100 SXM").

Dense peaks are vendor figures as collected in stas00/ml-engineering compute/accelerator/README.md
("ml-eng" below) and, for the consumer/inference cards, Lightning's throughput.py `_CUDA_FLOPS`.
"""
from __future__ import annotations

from tunekit.core.gpu import GPU, Sourced, check_table
from tunekit.core.registry import BF16, FP8, FP16, FP32, TF32

DEFAULT_DEVICE = "H100 SXM"   # a plan's device when none is named (tunekit.plan, lab.plan, `tunekit plan`)

_MLENG = "stas00/ml-engineering compute/accelerator/README.md, TFLOPS comparison table (dense)"
_LIGHTNING = "Lightning-AI/pytorch-lightning src/lightning/fabric/utilities/throughput.py _CUDA_FLOPS"
_ADA = "NVIDIA Ada (AD102) whitepaper: tensor bf16/fp16 with fp32 accumulate"
_AMPERE = "NVIDIA Ampere GA102 whitepaper: tensor bf16/fp16 with fp32 accumulate"
_TITAN = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md: 96GB HBM2e, 2.4 TB/s, 500 W"
# Its peak: "between SXM and NVL, and we don't know its exact value" (the same file, footnote 2): the
# middle of the two cards' dense figures (the table below, ml-eng), neither end favoured. Hopper's fp8
# rate is twice its bf16 (the SXM's 1979 / 989, the PCIe's 1513 / 756); the NVL row lists no fp8.
_TITAN_PEAK = (_TITAN + " (footnote 2: its peak 'between SXM and NVL', exact value unknown): the middle of the "
               "H100 SXM's and H100 NVL's dense figures (" + _MLENG + "); fp8 twice bf16, as on every Hopper row")
_CC = "developer.nvidia.com/cuda-gpus (compute capability)"
_SMS = "NVIDIA data sheet (streaming multiprocessors)"


def _sheet(card: str) -> str:
    return f"{card} data sheet (memory bandwidth)"


# Links inside one node, GB/s each way for one GPU (vendor data sheets give both ways summed);
# cards without NVLink / Infinity Fabric talk over PCIe x16 (Gen5 64, Gen4 32, Gen3 16 GB/s each way)
LINKS_SOURCE = "vendor data sheets (NVLink / Infinity Fabric / PCIe x16), each way per GPU"


def _link(gbs: float, what: str) -> Sourced:
    return Sourced(gbs, f"{LINKS_SOURCE}: {what}")


_NVLINK4 = _link(450, "NVLink 4, 900 GB/s both ways")
_GEN4, _GEN3 = _link(32, "PCIe Gen4 x16"), _link(16, "PCIe Gen3 x16")

# The node a card ships in, what a collective whose ring crosses nodes runs at (`node_net`: NICs per
# node, GB/s NCCL reaches through each). NCCL builds one ring (channel) per NIC: each leaves the node
# through its own NIC and the hops inside the node go over NVLink, so the bus bandwidth (nccl-tests
# doc/PERFORMANCE.md: an all-gather of S bytes over n ranks takes S (n-1)/n / busbw) of a collective over
# whole nodes is the node's NICs together or NVLink, whichever is lower ("add more NICs ... you should get
# more bandwidth, up to ... the NVLink intra-node bandwidth", NVIDIA/nccl#412). Measured: 2 HGX A100
# nodes with 4 x 200 Gb/s HDR reach 91 GB/s (NVIDIA/nccl-tests#100: 4 NICs x 23); 4 HGX H100 nodes with
# 8 x 400 Gb/s NDR reach 366 GB/s (NVIDIA/nccl-tests#309: 8 x 46). Per NIC, what NCCL reaches: HDR
# 200 Gb/s 24 GB/s (NVIDIA/nccl#412), NDR 400 Gb/s 46-48 GB/s, 47 taken (NVIDIA/nccl-tests#290, #267).
# A card without one (PCIe and consumer cards, sold in any chassis): planning.shard.ONE_NIC.
_NDR = "46-48 GB/s each (NVIDIA/nccl-tests#290)"
_DGX_A100 = Sourced((8, 24.0), "DGX A100: 8 x ConnectX-6 HDR 200 Gb/s, one per GPU (NVIDIA DGX A100 user guide; "
                               "mosaicml/llm-foundry scripts/train/benchmarking/README.md: '1600 Gbps node-node "
                               "interconnect'), 24 GB/s each (NVIDIA/nccl#412)")
_DGX_H100 = Sourced((8, 47.0), "DGX/HGX H100: 8 x ConnectX-7 NDR 400 Gb/s, one per GPU (NVIDIA DGX H100 user guide), "
                               + _NDR)
_GRAND_TETON = Sourced((8, 47.0), "Grand Teton: 400 Gb/s RoCE per GPU (engineering.fb.com 2024/03/12 'Building "
                                  "Meta's GenAI Infrastructure'), NDR's " + _NDR)
_DGX_H200 = Sourced((8, 47.0), "DGX H200: 8 x ConnectX-7 400 Gb/s, one per GPU (NVIDIA DGX H200 data sheet), " + _NDR)

# What nvidia-smi / NVML report as a card's total memory (what a process can ever hold, the CUDA
# context included): modal-labs/modal-client PR #2797 lists H100 81559, A100 80GB 81920, A100 40GB
# 40960, A10 23028, L40S 46068, L4 23034 and T4 15360 MiB (the GDDR cards with ECC on: below their
# nominal 48/24/16 GiB); an H100 NVL reports 99,961,274,368 bytes (fastfetch issue #1658)
DRIVER_SOURCE = "nvidia-smi totals: modal-labs/modal-client #2797, fastfetch-cli/fastfetch #1658"


def _driver(mib: float) -> Sourced:
    return Sourced(mib * 2**20, DRIVER_SOURCE)


# Maximum achievable matmul TFLOPS (MAMF), dense: the best a swept matmul reached through torch
_MAMF = ("stas00/ml-engineering compute/accelerator/README.md, Maximum Achievable Matmul FLOPS comparison table "
         "(swept bf16/fp8 matmuls through torch)")


def _mamf(bf16: float, fp8: float | None = None, note: str = "") -> dict:
    """bf16's figure (and fp16's: the same tensor-core rate), fp8's where the table has one."""
    out = {BF16: Sourced(bf16, _MAMF + note), FP16: Sourced(bf16, _MAMF + note + ", bf16's figure")}
    return out | ({FP8: Sourced(fp8, _MAMF)} if fp8 else {})


# Matmuls at transformer training shapes, as a share of the dense peak (the MAMF above is a best-shape
# search). Transformer Engine's GEMM profiling guide timed the 12 bf16 GEMMs of one layer (Fprop, Dgrad
# and Wgrad of QKV 4096 -> 12288, attention out 4096 -> 4096, MLP 4096 -> 16384 -> 4096: MPT-7b's shapes)
# over 31 x 512 = 15,872 tokens: 3 passes x 2 x 15872 x 4096 x 49152 = 1.9173e13 FLOPs in 32.014 ms on an
# H200 NVL (598.9 TFLOPS, 71.7% of its 835.5 dense) and in 12.758 ms on a B300 (1502.8, 66.8% of 2250).
# Each Hopper (Blackwell) row takes the H200 NVL's (B300's) share of its own dense peak.
_TE_GEMM = ("NVIDIA/TransformerEngine docs/examples/gemm_profiling/gemm_profiling.rst @ 8f2e635 (the bf16 Fprop, "
            "Dgrad and Wgrad GEMMs of a layer at hidden 4096, intermediate 16384, 15,872 tokens): ")
_LAYER_FLOPS = 3 * 2 * 15872 * 4096 * (12288 + 4096 + 16384 + 16384)
_HOPPER_GEMM = (_LAYER_FLOPS / 32.014e-3 / 1e12 / 835.5,
                _TE_GEMM + "32.014 ms a layer on an H200 NVL, 598.9 TFLOPS: 71.7% of its 835.5 dense (NVIDIA H200 "
                           "data sheet: 1,671 with sparsity)")
_BLACKWELL_GEMM = (_LAYER_FLOPS / 12.758e-3 / 1e12 / 2250,
                   _TE_GEMM + "12.758 ms a layer on a B300, 1502.8 TFLOPS: 66.8% of its 2250 dense (" + _MLENG + ")")


def _gemm(peak: float, family: tuple) -> dict:
    """bf16's (and fp16's: the same tensor-core rate) matmul TFLOPS at training shapes: ``family``'s
    measured share of the dense peak put to this card's ``peak``."""
    share, src = family
    rate = Sourced(peak * share, f"{src}; the share put to this card's {peak:g}")
    return {BF16: rate, FP16: rate}


# The share of the memory bandwidth a streaming kernel reaches (bytes read + written over time).
# The H100's and H200's: the project's own measurements (benchmarks/RESULTS.md, with card, date, torch)
_COPIES = ("measured 2026-11 on an {card}, torch 2.11.0+cu130 (driver CUDA 13): device-to-device copies ~{tbs} TB/s "
           "counting bytes read and written (benchmarks/RESULTS.md)")
_H100_COPIES = _COPIES.format(card="H100 80GB HBM3 (SXM)", tbs="3.0")

# Fused attention, forward + backward, as a share of the dense peak, by kernel, head dim and
# sequence length. FLOPs as the kernels' benchmarks count them (and tunekit's counter): forward
# 4*b*h*s^2*d, halved when causal, backward 2.5x the forward (it rebuilds QK^T). Each figure holds
# ((head_dim or None: any, seq, share), ...): the rows of the nearest head dim, interpolated in
# log(seq) and held flat outside (`attention_share`). Kernels (core.gpu.ATTENTION_KERNELS): "flash"
# = FlashAttention-2 (torch's SDPA flash kernel is FA2), "fa3" = FlashAttention-3 (Hopper),
# "triton" = the FlashAttention-1-era Triton kernel (HazyResearch flash_attn_triton.py on triton
# 2.0.0.dev20221202, which llm-foundry's attn_impl="triton" copied, its default until 2024).
#
# The figures are the bars of the FlashAttention-2 release's benchmark images, each bar's TFLOPS
# printed on it: Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png (the FlashAttention-2
# paper's Figure 4, arXiv 2307.08691) and assets/flash2_h100_fwd_bwd_benchmark.png, both @ 4f285b3, the
# panels "With causal mask, head dimension 64" and "... 128" (forward + backward, fp16, 2048 = heads x head
# dim, batch x seq = 16k tokens), seq 512, 1k, 2k, 4k, 8k, 16k. Their FLOPs are tunekit's: causal halved,
# fwd+bwd 3.5x the forward (benchmarks/benchmark_flash_attention.py @ 60499ab, `flops`). No bar beyond
# 16k: held flat there. Each kernel's tile is fixed (128 x 128 for the Triton one, flash_attn_triton.py),
# so a longer sequence only thins what the bars' rise from 512 to 16k amortizes (a row block's prologue
# and epilogue, the causal diagonal's half-masked tiles: 1 / (s/128 + 1) of the tiles run, 0.8% at 16k),
# and the bars flatten already (FA1 d128 80 -> 83, FA2 182 -> 189 from 8k to 16k on the A100).
# "triton": llm-foundry's flash_attn_triton.py (@ b2a43a1: "Copied from" HazyResearch flash-attention
# @ eff9fe6, imports triton_pre_mlir; setup.py installs triton-pre-mlir's triton_pre_mlir_sm90 branch)
# says "Overall Triton forward + backward is slightly slower than CUDA forward + backward": the CUDA
# FlashAttention-1 bars ("FlashAttention"), an upper bound. The images' "FlashAttention Triton" bar is
# another kernel (triton.ops.flash_attention, OpenAI Triton's, on the MLIR backend: the benchmark script).
# On the H100 the image has the CUDA FlashAttention-1 bars too: that kernel (sm80 mma, no wgmma) and the
# pre-MLIR Triton one (no Hopper backend) both run Ampere instructions there; no figure of the Triton
# kernel itself on a Hopper is published.
# FA2 and FA3 on Hopper: flash-attention PR #1791 (benchmark_attn.py, Hopper, head dim 128, seq 8192,
# causal): FA2 forward 1.935 ms at 284.1 TFLOPS, backward 4.788 ms at 287.1 -> 3.5 x 284.1 x 1.935 /
# 6.723 ms = 286.2 TFLOPS (28.9% of 989); FA3 forward 0.873 ms at 630.0, backward 2.585 ms at 531.6 ->
# 3.5 x 630.0 x 0.873 / 3.458 ms = 556.7 TFLOPS (56.3%). (FA3's "740 TFLOPS, 75%" is its best forward alone.)
# (The H100 image's FA2 bar at d128, 8k, causal: 308, of FA2 v2.0; PR #1791's is the newer measurement.)
_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
_FIG = "Dao-AILab/flash-attention assets/flash2_{card}_fwd_bwd_benchmark.png @ 4f285b3, causal fwd+bwd bars"


def _bars(peak: float, by_dim: dict) -> tuple:
    """((head dim, seq, share of ``peak``), ...) from each head dim's bars (TFLOPS) at `_SEQS`."""
    return tuple((d, s, tflops / peak) for d, bars in by_dim.items() for s, tflops in zip(_SEQS, bars))


_FA2_A100 = Sourced(_bars(312, {64: (88, 119, 140, 156, 165, 171), 128: (99, 133, 155, 173, 182, 189)}),
                    _FIG.format(card="a100") + ' "FlashAttention-2" (FlashAttention-2 paper, arXiv 2307.08691, '
                    "Fig. 4), over 312")
_FA1_A100 = Sourced(_bars(312, {64: (58, 70, 77, 87, 92, 97), 128: (55, 62, 69, 76, 80, 83)}),
                    _FIG.format(card="a100") + ' "FlashAttention" (FlashAttention-1, CUDA), over 312: the Triton '
                    "kernel 'slightly slower than CUDA forward + backward' (mosaicml/llm-foundry "
                    "llmfoundry/models/layers/flash_attn_triton.py @ b2a43a1)")
_HOPPER = "flash-attention PR #1791 benchmark_attn.py on Hopper (hdim 128, seq 8192, causal): "
_FA2_H100 = Sourced(((128, 8192, 3.5 * 284.1 * 1.935 / (1.935 + 4.788) / 989),),
                    _HOPPER + "FA2 286.2 TFLOPS fwd+bwd (28.9%)")
_FA3_H100 = Sourced(((128, 8192, 3.5 * 630.0 * 0.873 / (0.873 + 2.585) / 989),),
                    _HOPPER + "FA3 556.7 TFLOPS fwd+bwd (56.3%)")
_TRITON_H100 = Sourced(_bars(989, {64: (104, 123, 136, 138, 149, 156), 128: (98, 109, 108, 126, 135, 137)}),
                       _FIG.format(card="h100") + ' "FlashAttention" (FlashAttention-1, CUDA), over 989: the '
                       "Triton kernel 'slightly slower than CUDA' (llm-foundry flash_attn_triton.py @ b2a43a1), "
                       "both on Ampere mma there")

# What a card runs a training dtype as where it lists no peak for it (no tensor-core rate for it).
# bf16 and TF32 tensor cores arrive with Ampere, compute capability 8.0 (NVIDIA A100 Tensor Core GPU
# Architecture whitepaper; torch.cuda.is_bf16_supported(including_emulation=False) is False below it):
# on a V100 or T4 half precision is fp16 with a gradient scaler, and tf32 leaves the matmuls in fp32.
# CDNA2 has no TF32 (the AMD Instinct MI250X data sheet lists none; CDNA 3, the MI300's, adds it).
_BEFORE_AMPERE = {BF16: (FP16, "no bf16 tensor cores (they came with Ampere, compute capability 8.0): its "
                                   "half precision is fp16 with a gradient scaler (precision='fp16')"),
                  TF32: (FP32, "no TF32 tensor cores (they came with Ampere, compute capability 8.0): tf32 "
                                   "leaves its matmuls in fp32 (precision='fp32')")}


def _peaks(source, fp32, tf32=None, half=None, fp8=None, bf16=True) -> Sourced:
    """Dense peaks: fp32, tf32, bf16 and fp16 (``half``, the same rate; fp16 alone where not
    ``bf16``) and fp8, each where the card has it."""
    out = {FP32: fp32, TF32: tf32, BF16: half if bf16 else None, FP16: half, FP8: fp8}
    return Sourced({k: v for k, v in out.items() if v is not None}, source)


_HOPPER_PEAKS = dict(fp32=67, tf32=494.5, half=989, fp8=1979)

GPUS: tuple[GPU, ...] = (
    GPU("H100 NVL", ("h100", "nvl"), _peaks(_MLENG, 60, 417.5, 835.5), Sourced(94, _MLENG),
        driver_total=Sourced(99961274368, DRIVER_SOURCE), bandwidth=Sourced(3.9, _sheet("NVIDIA H100 NVL")),
        sms=Sourced(132, _SMS), link=_link(300, "the H100 NVL pair bridge, 600 GB/s both ways"),
        capability=Sourced((9, 0), _CC)),
    GPU("H100 PCIe", ("h100", "pcie"), _peaks(_MLENG, 51, 378, 756, 1513), Sourced(80, _MLENG),
        bandwidth=Sourced(2.0, _sheet("NVIDIA H100 PCIe")), sms=Sourced(114, _SMS), link=_link(64, "PCIe Gen5 x16"),
        capability=Sourced((9, 0), _CC)),
    # Meta's Grand Teton H100 (torchtitan's benchmarks): 96 GB HBM2e at 2.4 TB/s under a 500 W limit;
    # its peak is "between SXM and NVL": the middle of the two (_TITAN_PEAK). Its MAMF is the SXM's share
    # of the SXM's peak put to this one (`borrows`), and fused attention its share of this peak (the
    # 700 W SXM's own figures, taken before, are the range's top: an upper bound, not the likeliest figure)
    GPU("H100 SXM 96GB", ("h100", "96gb"),
        _peaks(_TITAN_PEAK, fp32=(67 + 60) / 2, tf32=(494.5 + 417.5) / 2, half=(989 + 835.5) / 2,
               fp8=989 + 835.5),   # twice the bf16 middle
        Sourced(96, _TITAN), bandwidth=Sourced(2.4, _TITAN),
        bandwidth_share=Sourced(3.0 / 3.35, f"the HBM3 H100 SXM's share ({_H100_COPIES}) of its 2.4 TB/s HBM2e"),
        gemm=_gemm((989 + 835.5) / 2, _HOPPER_GEMM), sms=Sourced(132, _SMS),
        attention={"flash": _FA2_H100, "fa3": _FA3_H100}, link=_NVLINK4, node_net=_GRAND_TETON,
        capability=Sourced((9, 0), _CC),
        borrows=Sourced("H100 SXM", "the same GH100 chip, 132 SMs (NVIDIA H100 data sheet); torchtitan's footnote 2: "
                                    "'HBM2e-based SXM H100 with lower TDP'")),
    GPU("H100 SXM", ("h100",), _peaks(_MLENG, **_HOPPER_PEAKS), Sourced(80, _MLENG), driver_total=_driver(81559),
        bandwidth=Sourced(3.35, _sheet("NVIDIA H100 SXM")), bandwidth_share=Sourced(3.0 / 3.35, _H100_COPIES),
        mamf=_mamf(794.5, 1402.6), gemm=_gemm(989, _HOPPER_GEMM), sms=Sourced(132, _SMS),
        attention={"flash": _FA2_H100, "fa3": _FA3_H100, "triton": _TRITON_H100}, link=_NVLINK4,
        node_net=_DGX_H100, capability=Sourced((9, 0), _CC)),
    # H200 shares H100's compute (its bf16 MAMF is given as the same figure)
    GPU("H200 SXM", ("h200",), _peaks(_MLENG, **_HOPPER_PEAKS), Sourced(141, _MLENG),
        bandwidth=Sourced(4.8, _sheet("NVIDIA H200")),
        bandwidth_share=Sourced(4.3 / 4.8, _COPIES.format(card="H200 141GB", tbs="4.3")),
        mamf=_mamf(794.5, note=" (H200: the H100's)") | {FP16: Sourced(794.5, _MAMF + ", bf16's"),
                                                          FP8: Sourced(1453.4, _MAMF)},
        gemm=_gemm(989, _HOPPER_GEMM), sms=Sourced(132, _SMS),
        attention={"flash": _FA2_H100, "fa3": _FA3_H100, "triton": _TRITON_H100}, link=_NVLINK4, node_net=_DGX_H200,
        capability=Sourced((9, 0), _CC)),
    GPU("B200", ("b200",), _peaks(_MLENG, 80, 1125, 2250, 4500), Sourced(180, _MLENG),
        bandwidth=Sourced(8.0, _sheet("NVIDIA B200")), mamf=_mamf(1745.0), gemm=_gemm(2250, _BLACKWELL_GEMM),
        sms=Sourced(148, _SMS),
        link=_link(900, "NVLink 5, 1.8 TB/s both ways"), capability=Sourced((10, 0), _CC)),
    GPU("A100 40GB", ("a100", "40gb"), _peaks(_MLENG, 19.5, 156, 312), Sourced(40, _MLENG),
        driver_total=_driver(40960),
        bandwidth=Sourced(1.555, "NVIDIA A100 data sheet: 1,555 GB/s for the 40GB (the 80GB SXM: 2,039 GB/s)"),
        sms=Sourced(108, _SMS), attention={"flash": _FA2_A100, "triton": _FA1_A100},
        link=_link(300, "NVLink 3, 600 GB/s both ways on A100 SXM"), node_net=_DGX_A100,
        capability=Sourced((8, 0), _CC),
        # no measurement of its own: the 80 GB card's MAMF and bandwidth, as shares of its own figures
        borrows=Sourced("A100 80GB", "the same GA100 chip and clocks (NVIDIA A100 data sheet), HBM2 against the "
                                     "80 GB card's HBM2e")),
    GPU("A100 80GB", ("a100",), _peaks(_MLENG, 19.5, 156, 312), Sourced(80, _MLENG), driver_total=_driver(81920),
        bandwidth=Sourced(2.0, _sheet("NVIDIA A100 80GB")),
        bandwidth_share=Sourced(1.80 / 2.04, "read kernel at 1.80 of 2.04 TB/s on an A100 80GB, NCU agreeing "
                                             "(forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/"
                                             "339083)"),
        mamf=_mamf(271.2), sms=Sourced(108, _SMS), attention={"flash": _FA2_A100, "triton": _FA1_A100},
        link=_link(300, "NVLink 3, 600 GB/s both ways on A100 SXM"), node_net=_DGX_A100,
        capability=Sourced((8, 0), _CC)),
    GPU("L40S", ("l40s",), _peaks(_MLENG, 91.6, 183, 362, 733), Sourced(48, _MLENG), memory_kind="gddr-ecc",
        driver_total=_driver(46068), bandwidth=Sourced(0.86, _sheet("NVIDIA L40S")), link=_GEN4,
        capability=Sourced((8, 9), _CC)),
    # L4's 242 is an int8 figure in the source, so it is not listed as fp8.
    GPU("L4", ("l4",), _peaks(_LIGHTNING, 30.3, 60, 121), Sourced(24, _LIGHTNING), memory_kind="gddr-ecc",
        driver_total=_driver(23034), bandwidth=Sourced(0.3, _sheet("NVIDIA L4")), link=_GEN4,
        capability=Sourced((8, 9), _CC)),
    GPU("A10G", ("a10",), _peaks(_LIGHTNING, 31.2, 62.5, 125), Sourced(24, _LIGHTNING), memory_kind="gddr-ecc",
        driver_total=_driver(23028), bandwidth=Sourced(0.6, _sheet("NVIDIA A10G")), link=_GEN4,
        capability=Sourced((8, 6), _CC)),
    GPU("V100 PCIe", ("v100", "pcie"), _peaks(_LIGHTNING, 14, half=112, bf16=False), link=_GEN3,
        capability=Sourced((7, 0), _CC), runs_instead=_BEFORE_AMPERE),
    GPU("V100 SXM", ("v100",), _peaks(_LIGHTNING, 15.7, half=125, bf16=False),
        link=_link(150, "NVLink 2, 300 GB/s both ways"), capability=Sourced((7, 0), _CC), runs_instead=_BEFORE_AMPERE),
    GPU("T4", ("t4",), _peaks(_LIGHTNING, 8.1, half=65, bf16=False), Sourced(16, _LIGHTNING), memory_kind="gddr-ecc",
        driver_total=_driver(15360), bandwidth=Sourced(0.32, _sheet("NVIDIA T4")), link=_GEN3,
        capability=Sourced((7, 5), _CC), runs_instead=_BEFORE_AMPERE),
    # GeForce cards: the tensor cores' bf16/fp16 rate with fp32 accumulation (what training uses),
    # half their fp16-accumulate rate; Lightning's table lists the CUDA cores' fp32 figure for
    # every dtype, which a bf16 run can beat (a "peak" below a measurement)
    GPU("RTX 4090", ("4090",), _peaks(_ADA, 82.6, 82.6, 165.2), Sourced(24, _ADA), memory_kind="gddr",
        bandwidth=Sourced(1.008, _sheet("NVIDIA GeForce RTX 4090")), link=_GEN4, capability=Sourced((8, 9), _CC)),
    GPU("RTX 3090", ("3090",), _peaks(_AMPERE, 35.6, 35.6, 71), Sourced(24, _AMPERE), memory_kind="gddr",
        bandwidth=Sourced(0.936, _sheet("NVIDIA GeForce RTX 3090")), link=_GEN4, capability=Sourced((8, 6), _CC)),
    # Per GCD, which is what one torch device is on an MI250X: half the package figures.
    GPU("MI250X (one GCD)", ("mi250",), _peaks(_MLENG, 47.9 / 2, half=383 / 2), Sourced(64, _MLENG),
        bandwidth=Sourced(3.2 / 2, "AMD Instinct MI250X data sheet (memory bandwidth): half the package's 3.2 TB/s"),
        platform="rocm", runs_instead={TF32: (FP32, "no TF32 (CDNA2; CDNA 3 added it): tf32 leaves its matmuls "
                                                        "in fp32 (precision='fp32')")}),
    GPU("MI300X", ("mi300",), _peaks(_MLENG, 163.4, 653.7, 1300, 2610), Sourced(192, _MLENG),
        bandwidth=Sourced(5.3, _sheet("AMD Instinct MI300X")), mamf=_mamf(668.4),
        link=_link(448, "Infinity Fabric, 7 x 128 GB/s both ways"), platform="rocm",
        blas_workspace=Sourced(128 * 2**20, "torch's hipBLASLt workspace for one stream on MI300 (gfx94x) "
                                            "(CublasHandlePool.cpp)")),
)

# Short names a person types, each the row the driver-name matching reads it as (tests/core/test_gpu_row.py)
ALIASES = {"h100": "H100 SXM", "h200": "H200 SXM", "b200": "B200", "a100": "A100 80GB", "a10": "A10G",
           "v100": "V100 SXM", "4090": "RTX 4090", "3090": "RTX 3090", "mi250x": "MI250X (one GCD)",
           "mi300": "MI300X"}

check_table(GPUS, ALIASES, DEFAULT_DEVICE)
