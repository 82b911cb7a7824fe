"""``specbind bench CKPT``: the installed bench, on a checkpoint of the user's own. The slicing
side reads exactly the bytes the bind reads of each tensor (so the two sides race over the same
share), and the command reports both sides' figures. Speed itself is never asserted."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import patience
import pytest
from safetensors import safe_open

from specbind.core.planning import Ranks
from specbind.generated import MODELS
from specbind.runtime.binder.tp import shard_raw
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth, tiny_values

# glm: row and column shards, per-member experts at ep 2; gpt-oss: a stacked expert family
# (an ep rank's rows of axis 0); phi3 as transformers writes it: fused q/k/v and gate/up, read
# as row sections of one stored tensor (then sharded within each section).
MODELS_READ = ("glm-5.3-flash", "gpt-oss", "phi3")
RANKS = (Ranks(), Ranks(2, 1), Ranks(2, 1, 2, 1))
PHI3: dict[str, Any] = dict(
    vocab_size=136, hidden_size=96, num_attention_heads=8, num_key_value_heads=4,
    intermediate_size=72, num_hidden_layers=2, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    tie_word_embeddings=False,
)  # fmt: skip


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for name in MODELS_READ[:2]:
        table = MODELS[name]
        ck = tmp_path_factory.mktemp("benchck") / name
        synth(table, ck, tiny_values(table), seed=0, progress=None)
        out[name] = ck
    return out


@pytest.fixture(scope="module")
def phi3_fused(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers", exc_type=ImportError)
    from hf_random import write_random

    path = tmp_path_factory.mktemp("benchphi3")
    write_random(
        transformers.Phi3ForCausalLM, transformers.Phi3Config, PHI3, path, re.compile(r"(?!)")
    )
    return path


# phi3 has no expert family: ep 2 is refused there (as the bind refuses it)
CASES = [(m, r) for r in RANKS for m in MODELS_READ if m != "phi3" or r.ep_size == 1]


@pytest.mark.parametrize(
    ("model", "ranks"),
    CASES,
    ids=[f"{m}-tp{r.tp_size}.{r.tp_rank}_ep{r.ep_size}" for m, r in CASES],
)
def test_the_slicing_side_reads_exactly_the_bytes_the_bind_reads_of_each_tensor(
    request: pytest.FixtureRequest, model: str, ranks: Ranks
) -> None:
    from specbind.bench import planned

    table = MODELS[model]
    ck = (
        request.getfixturevalue("phi3_fused")
        if model == "phi3"
        else request.getfixturevalue("ckpts")[model]
    )
    seen = sections = members = 0
    for plan, raw, (fn, name, spans) in planned(CheckpointDir(ck), table, {}, ranks):
        with safe_open(fn, framework="numpy") as f:
            got = f.get_slice(name)[tuple(slice(*s) if s else slice(None) for s in spans)]
        want = np.frombuffer(shard_raw(plan, raw, 0).data, np.uint8)
        got_bytes = np.ascontiguousarray(got).view(np.uint8).reshape(-1)  # [...] -> [n B]
        assert got_bytes.tobytes() == want.tobytes(), (name, spans)
        seen += 1
        sections += name.endswith(("qkv_proj.weight", "gate_up_proj.weight"))
        members += plan.members is not None
    assert seen > 10
    if model == "phi3":  # the fused tensors were read, each as its sections
        assert sections == (3 + 2) * PHI3["num_hidden_layers"]  # q, k, v; gate, up
    if model == "gpt-oss" and ranks.ep_size > 1:
        assert members > 0


def test_bench_reports_time_bandwidth_and_peak_rss_of_both_sides(ckpts: dict[str, Path]) -> None:
    proc = patience.run(
        [sys.executable, "-m", "specbind", "bench", str(ckpts["glm-5.3-flash"]), "--repeat", "1",
         "--tp-size", "2", "--tp-rank", "1", "--ep-size", "2", "--ep-rank", "0", "--json"],
        capture_output=True, text=True, cpu=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert (r["tp_size"], r["tp_rank"], r["ep_size"], r["ep_rank"]) == (2, 1, 2, 0)
    assert r["share_bytes"] > 0 and r["safetensors"]["held_bytes"] == r["share_bytes"]
    for side in ("specbind", "safetensors"):
        x = r[side]
        assert x["seconds"] > 0 and x["process_seconds"] >= x["seconds"]
        assert x["gib_per_s"] == pytest.approx(r["share_bytes"] / x["seconds"] / 2**30)
        assert x["peak_rss_mib"] > 0 and x["held_bytes"] > 0
    assert r["specbind_over_safetensors"] == pytest.approx(
        r["specbind"]["seconds"] / r["safetensors"]["seconds"]
    )


def test_bench_refuses_a_bad_repeat_and_a_missing_checkpoint_in_one_line(tmp_path: Path) -> None:
    from specbind.cli import main

    assert main(["bench", str(tmp_path), "--repeat", "0"]) == 2
    missing = patience.run(
        [sys.executable, "-m", "specbind", "bench", str(tmp_path / "none")],
        capture_output=True, text=True, cpu=120,
    )  # fmt: skip
    assert missing.returncode == 2  # a path that is not there, as ``bind`` says
    assert missing.stderr == f"specbind: error: {tmp_path / 'none'}: no such directory\n"


def test_bench_refuses_ranks_the_bind_would_refuse_before_starting_either_side(
    ckpts: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    from specbind.cli import main

    ck = str(ckpts["glm-5.3-flash"])
    assert main(["bench", ck, "--tp-size", "3", "--tp-rank", "0", "--repeat", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which tp 3 does not divide" in err
    assert "process failed" not in err  # refused here, not by a side's process
