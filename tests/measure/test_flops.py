"""Executed-FLOP counting, including what torch's counter misses."""
import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

from tunekit.measure.flops import count_flops, sdpa_backward_flops, sdpa_forward_flops


def test_sdpa_formulas():
    # B=2, H=4, S=64, D=16: forward 2*2*4*64*64*(16+16) = 2097152
    assert sdpa_forward_flops((2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 16)) == 2097152
    # backward 2*2*4*64*64*(3*16 + 2*16) = 5242880 (= 10*B*H*S*S*D)
    assert sdpa_backward_flops((2, 4, 64, 16), (2, 4, 64, 16), (2, 4, 64, 16)) == 5242880


def _attention(causal):
    q = torch.randn(2, 4, 64, 16, requires_grad=True)
    return lambda: F.scaled_dot_product_attention(q, q, q, is_causal=causal).sum().backward()


def test_cpu_sdpa_is_counted_where_torch_counts_zero():
    with FlopCounterMode(display=False) as fc:
        _attention(False)()
    torch_count = fc.get_total_flops()
    ours = count_flops(_attention(False))
    assert ours.executed == 2097152 + 5242880
    if torch_count == 0:  # torch 2.13: the gap tunekit fills
        assert any("CPU SDPA" in n for n in ours.notes)


def test_causal_sdpa_counts_half():
    ours = count_flops(_attention(True))
    assert ours.executed == (2097152 + 5242880) // 2   # 3670016
    assert ours.causal_halved == 3670016
    assert ours.recompute == 0


def _mlp(ckpt=None):
    torch.manual_seed(0)
    lin1 = torch.nn.Linear(32, 64, bias=False)
    lin2 = torch.nn.Linear(64, 32, bias=False)
    x = torch.randn(8, 32, requires_grad=True)
    def body(t):
        return lin2(F.gelu(lin1(t)))
    if ckpt is None:
        return lambda: body(x).sum().backward()
    return lambda: checkpoint(body, x, use_reentrant=ckpt == "reentrant").sum().backward()


def test_linear_gelu_linear_is_6n_per_token():
    # N = 32*64 + 64*32 = 4096 weights, 8 tokens: 6*4096*8 = 196608
    fc = count_flops(_mlp())
    assert (fc.executed, fc.recompute, fc.model) == (196608, 0, 196608)


def test_non_reentrant_checkpoint_recomputes_first_layer_only():
    # backward needs lin1's output (GELU's input) but not GELU's output: 2*8*32*64 = 32768 extra
    fc = count_flops(_mlp("non-reentrant"))
    assert (fc.executed, fc.recompute, fc.model) == (196608 + 32768, 32768, 196608)


def test_reentrant_checkpoint_recomputes_the_whole_forward():
    # the whole forward again: 2*N*tokens = 2*4096*8 = 65536
    fc = count_flops(_mlp("reentrant"))
    assert (fc.executed, fc.recompute, fc.model) == (196608 + 65536, 65536, 196608)


def test_a_count_off_the_main_thread_leaves_torch_compile_s_stance_alone():
    # the stance is one for the process: a count on the dashboard's expectation thread must not make
    # the main thread's compiled code run eagerly, nor leave "force_eager" set when threads interleave
    import threading

    import torch._dynamo.eval_frame as ef

    from tunekit.measure.flops import count_flops

    seen = []

    def on_a_thread():
        def step():
            seen.append(ef._stance.stance)
            return torch.nn.Linear(4, 4)(torch.randn(2, 4)).sum()
        count_flops(step)

    t = threading.Thread(target=on_a_thread)
    t.start()
    t.join()
    assert seen == ["default"] and ef._stance.stance == "default"
    count_flops(lambda: seen.append(ef._stance.stance))   # on the main thread: compiled code counted eagerly
    assert seen[-1] == "force_eager" and ef._stance.stance == "default"
