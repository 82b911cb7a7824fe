"""The vLLM bench row's arithmetic (the engine starts themselves run only in the vLLM venv, by
hand: BENCHMARKS.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.vllm_load import summary


def test_the_summary_gives_each_loaders_min_and_median_and_the_ratio_of_medians() -> None:
    rows = summary({
        "auto": [(2.0, 9.0, 10.0), (1.0, 5.0, 30.0), (4.0, 7.0, 20.0)],
        "specbind": [(0.5, 6.0, 1.0), (0.25, 4.0, 3.0), (3.0, 8.0, 2.0)],
    })  # fmt: skip
    assert rows[0].startswith("auto ") and "median 2.000 s (min 1.000)" in rows[0]
    assert "LLM(...): median 7.000 s (min 5.000)" in rows[0] and "median 20 (3 starts)" in rows[0]
    assert "median 0.500 s (min 0.250)" in rows[1] and "median 6.000 s (min 4.000)" in rows[1]
    assert rows[2] == "specbind / auto, medians: load_weights 0.25, LLM(...) 0.86"


def test_the_copy_side_gets_its_own_row_and_ratio_over_the_default_loader() -> None:
    from benchmarks.vllm_load import COPY

    rows = summary({
        "auto": [(2.0, 8.0, 1.0)], "specbind": [(0.5, 4.0, 1.0)], COPY: [(3.0, 10.0, 1.0)],
    })  # fmt: skip
    assert rows[2].startswith("specbind-copy ") and "median 3.000 s" in rows[2]
    assert rows[3] == "specbind / auto, medians: load_weights 0.25, LLM(...) 0.50"
    assert rows[4] == "specbind-copy / auto, medians: load_weights 1.50, LLM(...) 1.25"


def test_a_loader_with_no_start_gives_no_row_and_no_ratio() -> None:
    assert summary({"auto": [], "specbind": []}) == []


def test_the_peak_rss_is_this_address_spaces_own_not_one_inherited_across_exec() -> None:
    """A child forked from a process holding 256 MiB and exec'd reports its own peak, far
    below what the forking process held (ru_maxrss would report at least that)."""
    import subprocess
    import sys

    import numpy as np

    held = np.ones(256 << 20, np.uint8)  # resident in this process when it forks
    code = "from benchmarks.vllm_load import peak_rss_kib; print(peak_rss_kib())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert 0 < int(out.stdout) < 200 << 10  # KiB: well under the 256 MiB held at the fork
    assert held.all()


def test_the_summary_adds_post_processing_and_each_ranks_load_weights_at_tp_2() -> None:
    # (slowest rank's load_weights, LLM(...), faults, post-processing, bytes from storage,
    # rank 0, rank 1)
    rows = summary({
        "auto": [(2.0, 9.0, 10.0, 0.5, 2e9, 2.0, 1.5), (3.0, 9.0, 10.0, 0.7, 1e9, 2.5, 3.0)],
        "specbind": [(1.0, 8.0, 10.0, 0.4, 0, 1.0, 0.5), (0.5, 8.0, 10.0, 0.2, 0, 0.25, 0.5)],
    })  # fmt: skip
    assert "post-processing median 0.600 s" in rows[0]
    assert "read from disk median 1.50 GB" in rows[0] and "read from disk median 0.00 GB" in rows[1]
    assert "per rank 0: 2.250 (min 2.000), 1: 2.250 (min 1.500)" in rows[0]
    assert "per rank 0: 0.625 (min 0.250), 1: 0.500 (min 0.500)" in rows[1]
    assert rows[2].startswith("specbind / auto, medians: load_weights 0.30,")


def test_one_start_takes_the_slowest_rank_and_its_faults_and_every_ranks_seconds() -> None:
    from benchmarks.vllm_load import one_start

    lines = ["lw 1 2.5 700 10", "post 1 0.25 3 0", "lw 0 1.5 900 20", "post 0 0.75 4 5"]
    # (slowest load_weights, its faults, slowest post-processing, every rank's load_weights
    # bytes from storage summed, each rank's load_weights)
    assert one_start(lines, 2, "auto") == (2.5, 700.0, 0.75, 30.0, 1.5, 2.5)


def test_a_start_whose_ranks_did_not_each_load_once_is_refused_by_name() -> None:
    import pytest

    from benchmarks.vllm_load import one_start

    for lines in (["lw 0 1.0 5 0"], ["lw 0 1.0 5 0", "lw 0 1.2 5 0"], []):
        with pytest.raises(SystemExit, match=r"^specbind: load_weights ran on ranks \["):
            one_start(lines, 2, "specbind")


def test_the_records_file_is_read_once_and_emptied(tmp_path: Any) -> None:
    from benchmarks.vllm_load import take_records

    f = tmp_path / "times"
    f.write_text("lw 0 1.0 5\n\npost 0 0.5 1\n")
    assert take_records(str(f)) == ["lw 0 1.0 5", "post 0 0.5 1"]
    assert take_records(str(f)) == [] and f.read_text() == ""


def test_hub_names_nest_the_decoder_under_model_and_keep_the_head_and_the_bytes(
    tmp_path: Any,
) -> None:
    """A tiny two-shard checkpoint renamed: every tensor under its Hub name, with the same
    bytes, and the index naming the same shards."""
    import json

    import numpy as np
    from safetensors.numpy import load_file, save_file

    from benchmarks.vllm_load import hub_names

    rng = np.random.default_rng(0)
    shards = {
        "a.safetensors": {"embed_tokens.weight": rng.random((5, 3), np.float32)},
        "b.safetensors": {
            "layers.0.mlp.down_proj.weight": rng.random((3, 7), np.float32),
            "lm_head.weight": rng.random((5, 3), np.float32),
        },
    }
    for fn, ts in shards.items():
        save_file(ts, str(tmp_path / fn), metadata={"format": "pt"})
    wm = {n: fn for fn, ts in shards.items() for n in ts}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    hub_names(tmp_path)
    got = {fn: load_file(str(tmp_path / fn)) for fn in shards}
    assert sorted(got["b.safetensors"]) == ["lm_head.weight", "model.layers.0.mlp.down_proj.weight"]
    assert np.array_equal(got["a.safetensors"]["model.embed_tokens.weight"],
                          shards["a.safetensors"]["embed_tokens.weight"])  # fmt: skip
    assert np.array_equal(got["b.safetensors"]["model.layers.0.mlp.down_proj.weight"],
                          shards["b.safetensors"]["layers.0.mlp.down_proj.weight"])  # fmt: skip
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == {
        "model.embed_tokens.weight": "a.safetensors",
        "model.layers.0.mlp.down_proj.weight": "b.safetensors",
        "lm_head.weight": "b.safetensors",
    }


def test_an_unknown_checkpoint_name_is_refused_naming_those_there_are() -> None:
    import pytest

    from benchmarks.vllm_load import write_checkpoint

    with pytest.raises(SystemExit, match=r"--write 'gpt': unknown checkpoint \(one of llama-1"):
        write_checkpoint("gpt", Path("/nonexistent"))


def test_the_written_geometry_is_what_the_model_spec_accepts_at_the_sizes_claimed() -> None:
    """Each checkpoint's geometry evaluates under its model spec, and its bytes are the sizes
    the rows claim (1.34 GB Llama; a MoE of at least 4 GB, fused MoE sizes multiples of 32)."""
    from benchmarks.vllm_load import CHECKPOINTS, checkpoint_table
    from specbind.core.dtypes import DTYPES
    from specbind.synth import block_tensors, schedule

    sizes = {}
    for name, (_, layers, _, values) in CHECKPOINTS.items():
        table = checkpoint_table(name)
        geometry = table.make_geometry(table.default_values() | values)
        total = 0
        for plan in schedule(table, layers, mtp=False):
            for b in plan.blocks.values():
                total += sum(DTYPES[d].nbytes(s) for _, d, s in
                             block_tensors(table.block(b), geometry, plan.groups, False))  # fmt: skip
        g = table.block(table.globals)
        groups = frozenset(t.group for t in g.tensors if t.group is not None)
        total += sum(DTYPES[d].nbytes(s) for _, d, s in block_tensors(g, geometry, groups, False))
        sizes[name] = total
    assert abs(sizes["llama-1.34g"] - 1.344e9) < 0.01e9
    assert sizes["qwen3-moe-4g"] >= 4e9
    assert 4e9 <= sizes["deepseek-v3-mla-4g"] < 4.5e9  # dense layers: CONFIG's schedule
    assert CHECKPOINTS["qwen3-moe-4g"][3]["moe_intermediate"] % 32 == 0
