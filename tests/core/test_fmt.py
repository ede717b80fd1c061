"""core.fmt, the one home of tunekit's number formats: exact texts at the boundaries."""
import math

import pytest

from tunekit.core.fmt import (
    FORMATS,
    fmt_bytes,
    fmt_count,
    fmt_elapsed,
    fmt_flops,
    fmt_gib,
    fmt_mib,
    fmt_ms,
    fmt_pct,
    fmt_rate,
    fmt_seconds,
    fmt_tflops,
    formatted,
)

MISSING = (None, math.nan)


@pytest.mark.parametrize("n,signed,text", [
    (0, False, "0 B"),
    (0, True, "0 B"),                       # no sign on nothing
    (1023, False, "1023 B"),                # the last whole byte count
    (1024, False, "1.0 KiB"),               # 2**10
    (1536, True, "+1.5 KiB"),               # 1536 / 1024 = 1.5
    (-1536, False, "-1.5 KiB"),
    (-1536, True, "-1.5 KiB"),
    (3 * 2**20, False, "3.0 MiB"),
    (2**30 - 1, False, "1024.0 MiB"),       # (2**30 - 1) / 2**20 = 1023.999999: rounded, still MiB
    (5 * 2**30, False, "5.0 GiB"),
    (3 * 2**40, False, "3.0 TiB"),         # not "3072.0 GiB"
    (3 * 2**50, False, "3.0 PiB"),         # lab.expect(micro_batch=10**9): "2998828.9 GiB" was 2.9 PiB
])
def test_bytes(n, signed, text):
    assert fmt_bytes(n, signed) == text


@pytest.mark.parametrize("fmt", [fmt_bytes, fmt_gib, fmt_mib, fmt_seconds, fmt_ms, fmt_elapsed, fmt_flops,
                                 fmt_tflops, fmt_pct, fmt_count])
@pytest.mark.parametrize("missing", MISSING)
def test_a_missing_figure_is_na(fmt, missing):
    assert fmt(missing) == "n/a"


def test_gib_and_mib_in_fixed_units():
    assert fmt_gib(3 * 2**30) == "3.00 GiB"
    assert fmt_gib(1536 * 2**30, 1) == "1,536.0 GiB"       # thousands separated
    assert fmt_gib(-2**29) == "-0.50 GiB"                  # 2**29 / 2**30 = 0.5
    assert fmt_gib(2**20, 3) == "0.001 GiB"                # 2**20 / 2**30 = 0.000977 -> 0.001
    assert fmt_mib(1234.5 * 2**20) == "1,234.5 MiB"
    assert fmt_mib(3 * 2**20, 0) == "3 MiB"


@pytest.mark.parametrize("s,text", [
    (0, "0 µs"),
    (42e-6, "42 µs"),
    (0.0123, "12.3 ms"),
    (0.99995, "1 s"),            # 999.95 ms rounds to 1.00e3 ms: said in seconds, not '1e+03 ms'
    (0.00099995, "1 ms"),        # the same one unit down
    (1.5, "1.5 s"),
    (59.96, "60 s"),             # under a minute: seconds, rounded
    (125.25, "2 min 5.2 s"),     # 125.25 - 120 = 5.25, exact in binary: half to even -> 5.2
])
def test_seconds(s, text):
    assert fmt_seconds(s) == text


def test_ms():
    assert fmt_ms(0.25) == "250.0 ms"
    assert fmt_ms(1.25) == "1,250.0 ms"                          # thousands separated
    assert fmt_ms(42e-6) == "0.0 ms"                             # one decimal of a millisecond
    assert fmt_ms(42e-6, us_below_ms=True) == "42.0 µs"          # a plan's short steps: never '0.0 ms'
    assert fmt_ms(0.0009999, us_below_ms=True) == "999.9 µs"
    # one spelling of the unit: a plan's 'step >= 6.6 µs' as a run's 'min 821 µs' (fmt_seconds)
    assert fmt_ms(821e-6, us_below_ms=True).split()[1] == fmt_seconds(821e-6).split()[1] == "µs"
    assert fmt_ms(1e-3, us_below_ms=True) == "1.0 ms"
    assert fmt_ms(0, us_below_ms=True) == "0.0 ms"               # nothing is no shorter in us
    assert fmt_elapsed(12.34) == "12.3 s"
    assert fmt_elapsed(0) == "0.0 s"


@pytest.mark.parametrize("n,text", [
    (0, "0 FLOP"), (999, "999 FLOP"), (1000, "1.0 kFLOP"), (3.3e10, "33.0 GFLOP"), (2.5e15, "2.5 PFLOP"),
])
def test_flops(n, text):
    assert fmt_flops(n) == text


def test_tflops():
    assert fmt_tflops(41.234) == "41.2 TFLOPS"
    assert fmt_tflops(989.43, 4) == "989.4 TFLOPS"    # a spec sheet's peak: 4 digits
    assert fmt_tflops(0) == "0 TFLOPS"


@pytest.mark.parametrize("x,kw,text", [
    (0.404, {}, "40.4%"),
    (0, {}, "0.0%"),
    (1.0, {}, "100.0%"),
    (0.99951, {}, "100.0%"),                 # 99.951 -> 100.0
    (-0.05, {"digits": 0}, "-5%"),
    (0.4, {"digits": 0, "signed": True}, "+40%"),
    (-0.25, {"digits": 0, "signed": True}, "-25%"),
    (0.0, {"digits": 0, "signed": True}, "+0%"),
    (-0.001, {"digits": 0, "signed": True}, "+0%"),   # -0.1% rounds to 0: Python's own says '-0%'
    (-0.0004, {}, "0.0%"),                            # -0.04% to 1 digit: 0.0, no minus either
    (0.000346, {}, "0.035%"),    # a level that rounds to 0.0 keeps 2 significant digits: 0.0346% -> 0.035%
    (0.003, {"digits": 0}, "0.30%"),                  # 0.3% to 0 digits would read 0%
    (2e-7, {}, "0.000020%"),                         # 2.0e-5 %, never an exponent
    (0.0004, {"signed": True}, "+0.0%"),              # a change that rounds to 0 stays 0: too small to matter
    # a level under 1% keeps 2 significant digits: 0.00047 and 0.00055 read '0.047%' and '0.1%' side by
    # side in a Monitor's MFU column (twice, where it was 17% more)
    (0.00055, {}, "0.055%"), (0.0047, {}, "0.47%"), (0.00999, {}, "1.00%"), (0.0047, {"signed": True}, "+0.5%"),
    (0.0047, {"digits": 3}, "0.470%"),
])
def test_pct(x, kw, text):
    assert fmt_pct(x, **kw) == text
    if abs(100 * x) >= 1 or x == 0:   # no negative zero, no level under 1%: Python's own agrees
        assert fmt_pct(x, **kw) == f"{x:{'+' if kw.get('signed') else ''}.{kw.get('digits', 1)}%}"


@pytest.mark.parametrize("n,text", [
    (0, "0"), (999, "999"), (1000, "1k"), (426624, "426.6k"), (999_999, "1M"),   # 999.999k rounds to 1M
    (1.24e8, "124M"), (1.2e6, "1.2M"), (3.4e9, "3.4B"), (-1.5e6, "-1.5M"),
])
def test_count(n, text):
    assert fmt_count(n) == text


def test_rate_and_table_formats():
    assert fmt_rate(12345.6) == "12,346 tokens/s"
    assert fmt_rate(0.4, "samples/s") == "0 samples/s"
    assert fmt_rate(math.nan) == "n/a tokens/s"            # the unit still says what is missing
    assert formatted(0.5, FORMATS["MFU"]) == "50.0%"
    assert formatted(0.0003, FORMATS["MFU"]) == "0.030%"   # a table's MFU: fmt_pct's significant digits
    assert formatted(1234.56, FORMATS["step (ms)"]) == "1,234.6"
    assert formatted(None, FORMATS["loss"]) == "n/a"
    assert formatted("12 ⚠", FORMATS["TFLOPS"]) == "12 ⚠"   # a flagged figure is text already
