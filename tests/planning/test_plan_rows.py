"""The plan's memory rows line up: one name column as wide as its longest name, every figure
right-aligned in one column (an MI300X plan's 'hipblaslt_workspace', 19 characters, pushed its
figure two places right; an 'unknown' component stood four places left of the figures)."""
from types import SimpleNamespace

from tunekit.planning.record import memory_rows

GIB = 2 ** 30


def test_every_memory_row_s_figure_ends_in_one_column():
    p = SimpleNamespace(peak_bytes=0.5 * GIB, peak_at="backward", other_bytes=0.25 * GIB,
                        components={"weights": 0.125 * GIB, "activations": float("nan")},
                        fixed={"hip_context": (0.47 * GIB, "src"), "hipblaslt_workspace": (0.125 * GIB, "src")})
    rows = memory_rows(p)[1:]   # below the peak's line
    assert [r.split("  (")[0] for r in rows] == [   # 4 + 19 (the longest name) + 14: each ends at 37
        "    weights                 0.125 GiB",
        "    activations               unknown",
        "    other at the peak       0.250 GiB",
        "    hip_context             0.470 GiB",
        "    hipblaslt_workspace     0.125 GiB",
    ]
