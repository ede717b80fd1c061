"""measure.rng: dropout's random-fill rate, measured once per machine, torch and thread count, then read."""
def test_the_rate_is_measured_once_then_read(monkeypatch, tmp_path):
    from tunekit.measure import rng

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(rng, "bernoulli_rate", lambda dtype: calls.append(dtype) or 1.7e8)
    first = rng.measure_rng()
    assert first["rates"] == {"fp32": 1.7e8, "bf16": 1.7e8} and len(calls) == 2   # one trial set per dtype
    assert rng.measure_rng() == first and len(calls) == 2        # read from rng.json, nothing measured
    rng.measure_rng(refresh=True)
    assert len(calls) == 4                                       # refresh measures both again


def test_a_real_fill_rate_is_positive():
    import torch

    from tunekit.measure.rng import bernoulli_rate

    # 4096 elements: a real bernoulli_ timed; its rate is some positive number of elements per second
    assert bernoulli_rate(torch.float32, elements=4096) > 0
