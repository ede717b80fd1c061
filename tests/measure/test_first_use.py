"""measure.first_use: the memory a CPU kernel library keeps once per process, measured in fresh child
processes once per machine, torch and thread count, then read; and the kernels a plan's op records name."""
MiB = 2**20


def test_the_figures_are_measured_once_then_read(monkeypatch, tmp_path):
    from tunekit.measure import first_use

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    calls = []

    def children(dtypes, threads):
        calls.append(dtypes)
        return {"fp32": [{"dtype_bytes": 1.0 * MiB, "shape_bytes": 0.25 * MiB, "attention_bytes": 0.0}] * 3,
                "bf16": [{"dtype_bytes": d * MiB, "shape_bytes": s * MiB, "attention_bytes": 3.0 * MiB}
                         for d, s in ((3.0, 0.5), (3.5, 0.75), (3.25, 0.5))]}

    monkeypatch.setattr(first_use, "measure_child", children)
    first = first_use.measure_first_use()
    # each figure the median of its dtype's children: bf16 dtype_bytes median(3, 3.5, 3.25) = 3.25 MiB,
    # shape_bytes median(0.5, 0.75, 0.5) = 0.5 MiB
    assert first["figures"]["bf16"] == {"dtype_bytes": 3.25 * MiB, "shape_bytes": 0.5 * MiB,
                                        "attention_bytes": 3.0 * MiB}
    assert first["figures"]["fp32"]["shape_bytes"] == 0.25 * MiB and len(calls) == 1
    assert first_use.measure_first_use() == first and len(calls) == 1    # read from first_use.json
    first_use.measure_first_use(refresh=True)
    assert len(calls) == 2


def test_a_dtype_no_child_measured_is_left_out(monkeypatch, tmp_path):
    from tunekit.measure import first_use

    monkeypatch.setenv("TUNEKIT_CACHE", str(tmp_path))
    monkeypatch.setattr(first_use, "measure_child", lambda dtypes, threads: {
        "fp32": [{"dtype_bytes": 0.0, "shape_bytes": 0.0, "attention_bytes": 0.0}], "bf16": []})
    assert set(first_use.measure_first_use()["figures"]) == {"fp32"}


def test_a_real_child_reports_its_three_figures():
    from tunekit.measure.first_use import FIGURES, measure_child

    # one fresh process of this Python measures bf16's figures (their sizes are this machine's: not compared)
    [row] = measure_child(("bf16",), threads=1, repeats=1)["bf16"]
    assert set(FIGURES) <= set(row) and all(row[f] >= 0 for f in FIGURES)


def test_a_plans_kernels_are_its_matmul_and_attention_records():
    from tunekit.planning.expect import kernel_keys

    ops = [("mm", "matmul", "forward", 10, 8, (4, 8, 16, 1), 2, (), "bfloat16"),
           ("mm", "matmul", "forward", 10, 8, (4, 8, 16, 1), 2, (), "bfloat16"),   # the same kernel again
           ("mm", "matmul", "backward", 10, 8, (8, 4, 16, 1), 2, (), "bfloat16"),
           ("_scaled_dot_product_flash_attention_for_cpu", "attention", "forward", 9, 8, (64, 64, 32, 8), 2, (),
            "bfloat16"),
           ("add", "memory", "forward", 0, 8, None, 2, (), "bfloat16"),           # no kernel a library keeps
           ("mm", "matmul", "forward", 10, 8, (4, 8, 16, 1), 2)]                   # no signature: left out
    assert kernel_keys(ops) == {("matmul", "bfloat16", "mm", "forward", (4, 8, 16, 1)),
                                ("matmul", "bfloat16", "mm", "backward", (8, 4, 16, 1)),
                                ("attention", "bfloat16", "_scaled_dot_product_flash_attention_for_cpu", "forward",
                                 (64, 64, 32, 8))}
