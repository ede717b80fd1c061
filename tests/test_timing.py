"""The timing helpers' verdict: helped / hurt / within noise from repeated measurements."""
import pytest

from tunekit import verdict


def test_verdict_compares_best_repeats_against_the_noise_band():
    v = verdict([1.00, 1.02, 1.30], [0.50, 0.51])
    # best 1.00 vs 0.50 -> 2.00x; gaps 2% and 2% -> band = floor 5%
    assert (v.speedup, v.band, v.word) == (2.0, 0.05, "helped") and str(v) == "helped (2.00x, noise band ±5%)"
    v = verdict([1.0, 1.2], [1.1, 1.15])
    # 1.0/1.1 = 0.909x; band = max(5%, 20%, 4.5%) = 20%: 0.909 > 1/1.2 = 0.833 -> within noise
    assert v.word == "within noise" and abs(v.band - 0.2) < 1e-12
    assert verdict([1.0, 1.01], [1.2, 1.21]).word == "hurt"   # 0.833x, band 5%
    with pytest.raises(ValueError, match="at least 2"):
        verdict([1.0], [1.0, 1.1])
    with pytest.raises(ValueError, match="positive finite"):
        verdict([1.0, float("nan")], [1.0, 1.1])
