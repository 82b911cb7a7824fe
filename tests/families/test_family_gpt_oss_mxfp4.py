"""gpt-oss in its hub MXFP4 layout binds through the scheme ``specs/schemes/mxfp4.yaml``: the
BF16 tiny checkpoint transformers writes, its experts re-stored as ``<param>_blocks`` U8
[E, O, I/32, 16] and ``<param>_scales`` U8 [E, O, I/32] (E8M0) by a quantizer written here
from the OCP MX v1.0 spec (``gpt_oss_model.quantize_mxfp4``), config.json's
``quantization_config`` as the hub's.

Claims:
* the dequant equals transformers' ``convert_moe_packed_tensors`` bit for bit for every byte
  under every scale 0..254, and decodes scale 255 as NaN (the OCP spec);
* ``audit`` accounts for every tensor; ``modules_to_not_convert`` globs exclude what is under
  them (the attention linears bind BF16), and an excluded module that carries blocks is
  refused in one line;
* every tp the KV heads allow times every ep binds and rejoins; each rank's ``w13_blocks``,
  ``w13_scales``, ``w2_blocks``, ``w2_scales`` are vLLM's MXFP4 narrow (gpt_oss.py
  ``_load_weights_mxfp4``): rows [2·t0, 2·t1) of gate_up's, whole blocks [t0/32, t1/32) of
  down's, this ep rank's experts;
* ``w13`` / ``w2`` (BF16, dequantized) equal transformers' dequant of the stored blocks, and
  the MoE from the bound fields, summed over ranks, equals GptOssMLP holding those weights.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gpt_oss_model import CONFIG, E2M1, write_mxfp4_checkpoint
from helpers import cached_binds, copy_with, rejoin
from test_family_gpt_oss import _rank_moe
from whole_model import expert_range, read_checkpoint

from specbind.audit import audit
from specbind.core.errors import BindError
from specbind.generated import MODELS
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder.quant_numerics import dequant_mxfp4
from specbind.runtime.io.checkpoint import CheckpointDir

torch = pytest.importorskip("torch", exc_type=ImportError)
transformers = pytest.importorskip("transformers", exc_type=ImportError)
mxfp4 = pytest.importorskip("transformers.integrations.mxfp4", exc_type=ImportError)

pytestmark = pytest.mark.interop

TABLE = MODELS["gpt-oss"]
E, H = CONFIG["num_local_experts"], CONFIG["num_attention_heads"]
INTER, X = CONFIG["intermediate_size"], CONFIG["hidden_size"]
RANKS = [(tp, ep) for tp in (1, 2) for ep in (1, 2, 3, 6)]


@pytest.fixture(scope="module")
def mx_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gpt_oss_model import write_gpt_oss_checkpoint

    bf16 = tmp_path_factory.mktemp("gpt_oss_bf16")
    write_gpt_oss_checkpoint(bf16, seed=1)
    out = tmp_path_factory.mktemp("gpt_oss_mxfp4") / "ckpt"
    write_mxfp4_checkpoint(bf16, out)
    return out


@pytest.fixture(scope="module")
def bind_at(mx_ckpt: Path) -> Callable[[int, int, int, int], BindResult]:
    return cached_binds(mx_ckpt, TABLE)


def _theirs(blocks: Any, scales: Any) -> Any:
    """transformers' dequant, in its [E, I, O] parameter layout, as BF16 bits."""
    w = mxfp4.convert_moe_packed_tensors(torch.from_numpy(blocks), torch.from_numpy(scales))
    return w.contiguous().view(torch.int16).numpy()


def test_dequant_equals_transformers_for_every_byte_under_every_scale() -> None:
    rows = np.arange(256, dtype=np.uint8).reshape(16, 16)  # every byte, once per scale
    blocks = np.broadcast_to(rows, (255, 16, 16))[None].copy()  # [1, O=255, 16, 16]
    scales = np.broadcast_to(np.arange(255, dtype=np.uint8)[:, None], (255, 16))[None].copy()
    ours = dequant_mxfp4(blocks, scales)  # [1, O, I]
    assert (
        ours.transpose(0, 2, 1).copy().view(np.int16).tobytes() == _theirs(blocks, scales).tobytes()
    )
    nan = dequant_mxfp4(blocks[:, :1], np.full((1, 1, 16), 255, np.uint8))
    assert np.isnan(nan.astype(np.float32)).all(), "E8M0 255 is NaN"


def test_dequant_of_the_ocp_quantizer_is_the_ocp_value(mx_ckpt: Path) -> None:
    """value = E2M1[code] · 2^(scale - 127), decoded here from the spec's table alone."""
    stored = read_checkpoint(mx_ckpt)
    b = stored["model.layers.0.mlp.experts.down_proj_blocks"]
    s = stored["model.layers.0.mlp.experts.down_proj_scales"]
    codes = np.stack([b & 0xF, b >> 4], axis=-1).reshape(*s.shape, 32)
    table = np.array([*E2M1, *(-m for m in E2M1)])
    want = table[codes] * np.exp2(s.astype(np.float64) - 127)[..., None]
    got = dequant_mxfp4(b, s).astype(np.float64).reshape(want.shape)
    assert np.array_equal(got, want)


def test_audit_accounts_for_every_tensor_and_the_globs_exclude_what_is_under_them(
    mx_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    rep = audit(CheckpointDir(mx_ckpt), TABLE, progress=False)
    names = read_checkpoint(mx_ckpt)
    assert rep["coverage"] == {"bound": len(names), "declared_unbound": 0, "unaccounted": 0}
    assert rep["problems"] == []
    a = bind_at(1, 0, 1, 0).layers[0].slots["attention"].weights.arrays()
    assert str(a["q_proj"].dtype) == "bfloat16" and a["q_proj"].shape == (H * 12, X)


def test_an_excluded_module_that_carries_blocks_is_refused_in_one_line(
    mx_ckpt: Path, tmp_path: Path
) -> None:
    config = json.loads((mx_ckpt / "config.json").read_text())
    qc = config["quantization_config"]
    qc["modules_to_not_convert"] = [*qc["modules_to_not_convert"], "model.layers.*.mlp.experts"]
    bad = copy_with(mx_ckpt, tmp_path / "bad", config={"quantization_config": qc})
    with pytest.raises(BindError) as e:
        bind_checkpoint(CheckpointDir(bad), TABLE, progress=False)
    assert "excluded from quantization" in str(e.value) and "\n" not in str(e.value)
    assert "'model.layers.*.mlp.experts'" in str(e.value)


@pytest.mark.parametrize(("tp", "ep"), RANKS, ids=[f"tp{t}-ep{e}" for t, e in RANKS])
def test_every_rank_binds_its_share_in_vllms_mxfp4_layout_and_the_shares_rejoin(
    mx_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult], tp: int, ep: int
) -> None:
    full = {k: a for k, (_, a) in bind_at(1, 0, 1, 0).fields().items()}
    shares = {(r, e): bind_at(tp, r, ep, e).fields() for r in range(tp) for e in range(ep)}
    rules = {k: rule for k, (rule, _) in shares[(0, 0)].items()}
    assert set(rules) == set(full) and "layers.1.mlp.w13_blocks" in rules
    for name, want in full.items():
        got = rejoin(rules[name], {k: v[name][1] for k, v in shares.items()}, tp, ep)
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
    stored = read_checkpoint(mx_ckpt)
    pre = "model.layers.1.mlp.experts."
    per = INTER // tp
    for e in range(ep):
        lo, count = expert_range(E, ep, e)
        for t in range(tp):
            f = {k: a for k, (_, a) in shares[(t, e)].items()}
            s, end = t * per, (t + 1) * per
            for p in ("blocks", "scales"):  # vLLM: weight[:, 2 * start : 2 * end, ...]
                want = stored[f"{pre}gate_up_proj_{p}"][lo : lo + count, 2 * s : 2 * end]
                assert f[f"layers.1.mlp.w13_{p}"].tobytes() == np.ascontiguousarray(want).tobytes()
            # vLLM: blocks viewed [E, X, I/2], [..., start // 2 : end // 2]; scales by // 32
            w2 = stored[pre + "down_proj_blocks"].reshape(E, X, INTER // 2)[lo : lo + count]
            want2 = np.ascontiguousarray(w2[..., s // 2 : end // 2])
            assert f["layers.1.mlp.w2_blocks"].tobytes() == want2.tobytes()
            sc = stored[pre + "down_proj_scales"][lo : lo + count, :, s // 32 : end // 32]
            assert f["layers.1.mlp.w2_scales"].tobytes() == np.ascontiguousarray(sc).tobytes()


def test_dequantized_fields_and_the_moe_equal_transformers(
    mx_ckpt: Path, bind_at: Callable[[int, int, int, int], BindResult]
) -> None:
    stored = read_checkpoint(mx_ckpt)
    pre = "model.layers.1.mlp.experts."
    gate_up = _theirs(stored[pre + "gate_up_proj_blocks"], stored[pre + "gate_up_proj_scales"])
    down = _theirs(stored[pre + "down_proj_blocks"], stored[pre + "down_proj_scales"])
    m = bind_at(1, 0, 1, 0).layers[1].slots["mlp"].weights.arrays()
    assert m["w13"].view(np.int16).tobytes() == gate_up.transpose(0, 2, 1).copy().tobytes()
    assert m["w2"].view(np.int16).tobytes() == down.transpose(0, 2, 1).copy().tobytes()
    config = transformers.GptOssConfig(**CONFIG)
    config._experts_implementation = "eager"
    mlp = transformers.models.gpt_oss.modeling_gpt_oss.GptOssMLP(config).double()
    with torch.no_grad():
        mlp.router.weight.copy_(
            torch.from_numpy(stored["model.layers.1.mlp.router.weight"].astype(np.float64))
        )
        mlp.router.bias.copy_(
            torch.from_numpy(stored["model.layers.1.mlp.router.bias"].astype(np.float64))
        )
        for name, bits in (("gate_up_proj", gate_up), ("down_proj", down)):
            w = torch.from_numpy(bits).view(torch.bfloat16).double()
            getattr(mlp.experts, name).copy_(w)
            bias = stored[pre + name + "_bias"].astype(np.float64)
            getattr(mlp.experts, name + "_bias").copy_(torch.from_numpy(bias))
    x = np.random.default_rng(3).standard_normal((9, X)) * 0.5
    with torch.no_grad():
        want = mlp(torch.from_numpy(x)[None])[0][0].numpy()
    for tp, ep in ((1, 1), (2, 3)):
        got = np.zeros_like(x)
        for e in range(ep):
            lo, _ = expert_range(E, ep, e)
            for t in range(tp):
                f = bind_at(tp, t, ep, e).layers[1].slots["mlp"].weights.arrays()
                got += _rank_moe(x, f, lo, t, config)
        assert np.abs(got - want).max() <= 1e-9 * np.abs(want).max(), (tp, ep)


@pytest.mark.parametrize(("tp", "ep"), [(2, 1), (2, 3), (1, 6)])
def test_plan_counts_each_stacked_member_on_one_ep_rank(
    mx_ckpt: Path, capsys: pytest.CaptureFixture[str], tp: int, ep: int
) -> None:
    """``plan CKPT``: the ranks' bytes sum to what the layout says (the packed companions
    split as the binder splits them, each expert's rows on one ep rank)."""
    from specbind.cli import main

    args = ["plan", str(mx_ckpt), "--tp-size", str(tp), "--ep-size", str(ep), "--json"]
    assert main(args) == 0
    totals = json.loads(capsys.readouterr().out)["totals"]
    assert totals["sum_rank_bytes"] == totals["expected_sum"]
    by_rank = {(t, e): bind_checkpoint(CheckpointDir(mx_ckpt), TABLE, tp_size=tp, tp_rank=t,
                                       ep_size=ep, ep_rank=e, progress=False).as_dict()["bytes"]
               for t in range(tp) for e in range(ep)}  # fmt: skip
    assert sum(by_rank.values()) == totals["sum_rank_bytes"]
