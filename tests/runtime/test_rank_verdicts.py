"""One checkpoint, one verdict at every rank layout: a rule about a whole layer (scales shared
across experts, or across gate and up) or a whole tensor (the exact narrowing of a stored conv)
refuses on every tp and ep rank with the same one-line message, or on none.

Each rank is bound on its own, as separately started ranks would be; the checkpoints are
``synth`` ones edited in one tensor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import TABLE, TINY, copy_with, read_file

from specbind.core.errors import BindError
from specbind.runtime.bind.bind import BindResult, bind_checkpoint
from specbind.runtime.binder import checks
from specbind.runtime.io.checkpoint import CheckpointDir
from specbind.synth import synth

# Every linear NVFP4 at tp 1 (as test_quant_claims); 6 experts, so ep 1, 2, 3 and 6 divide them.
GEO = TINY | {
    "hidden": 128, "intermediate": 128, "moe_intermediate": 64, "v_head_dim": 32,
    "q_lora_rank": 48, "kv_lora_rank": 32,
}  # fmt: skip
NVFP4 = next(s for s in TABLE.schemes if s.name == "nvfp4-compressed-tensors")
EXPERT = "layers.3.mlp.experts.4."  # a routed expert of a MoE layer, owned by one rank at ep > 1
CONV = "layers.0.self_attn.q_conv1d.weight"  # a KDA conv: [Q, 1, K], rows split by head
LAYOUTS_EP = [(ep, r) for ep in (1, 2, 3, 6) for r in range(ep)]
LAYOUTS_TP = [(tp, r) for tp in (1, 2, 4) for r in range(tp)]


def tensors(path: Path) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for f in sorted(path.glob("*.safetensors")):
        out |= read_file(f)
    return out


@pytest.fixture(scope="module")
def nvfp4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("verdicts") / "nvfp4"
    synth(TABLE, d, GEO, layers=4, seed=3, quant=NVFP4)
    return d


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("verdicts") / "plain"
    synth(TABLE, d, TINY, layers=2, seed=3, mtp=False)
    return d


def bind(path: Path, tp: int = 1, r: int = 0, ep: int = 1, e: int = 0, **kw: object) -> BindResult:
    return bind_checkpoint(
        CheckpointDir(path), TABLE, tp_size=tp, tp_rank=r, ep_size=ep, ep_rank=e,
        progress=False, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def verdict(path: Path, tp: int = 1, r: int = 0, ep: int = 1, e: int = 0) -> str:
    try:
        bind(path, tp, r, ep, e)
    except BindError as err:
        return str(err)
    return "bound"


def scaled(src: Path, dest: Path, names: list[str], by: float) -> Path:
    t = tensors(src)
    return copy_with(src, dest, {n: np.asarray(t[n] * by, dtype=np.float32) for n in names})


def test_an_expert_input_scale_that_differs_is_refused_identically_by_every_ep_rank(
    nvfp4: Path, tmp_path: Path
) -> None:
    # gate and up of expert 4 agree with each other and differ from the other experts: a rank
    # that holds expert 4 alone sees nothing wrong in its own experts
    names = [f"{EXPERT}{m}.input_global_scale" for m in ("gate_proj", "up_proj")]
    d = scaled(nvfp4, tmp_path / "c", names, 2.0)
    seen = {(ep, e): verdict(d, ep=ep, e=e) for ep, e in LAYOUTS_EP}
    assert len(set(seen.values())) == 1, seen
    msg = seen[1, 0]
    assert msg.startswith("layer 3: input scales that must be one value differ"), msg
    assert "mlp.experts.4.gate_proj.input_global_scale" in msg
    assert "\n" not in msg
    for ep, e in LAYOUTS_EP:
        bind(d, ep=ep, e=e, allow_unshared_scales=True)  # the flag says otherwise: bound


def test_a_gate_global_scale_that_differs_from_its_up_is_refused_by_every_ep_rank(
    nvfp4: Path, tmp_path: Path
) -> None:
    d = scaled(nvfp4, tmp_path / "c", [f"{EXPERT}gate_proj.weight_global_scale"], 2.0)
    seen = {(ep, e): verdict(d, ep=ep, e=e) for ep, e in LAYOUTS_EP}
    assert len(set(seen.values())) == 1, seen
    msg = seen[1, 0]
    assert msg.startswith("layer 3: global scales that must be one value differ"), msg
    assert "mlp.experts.4.gate_proj.weight_global_scale" in msg


def test_a_misformed_scale_of_another_ranks_expert_is_refused_by_every_ep_rank(
    nvfp4: Path, tmp_path: Path
) -> None:
    n = f"{EXPERT}down_proj.input_global_scale"
    d = copy_with(nvfp4, tmp_path / "c", {n: np.ones(2, dtype=np.float32)})
    seen = {(ep, e): verdict(d, ep=ep, e=e) for ep, e in LAYOUTS_EP}
    assert len(set(seen.values())) == 1, seen
    assert f"{n.removeprefix('layers.3.')} has shape [2], expected [1]" in seen[1, 0]


@pytest.mark.parametrize("row", [5, -3])
def test_a_conv_row_that_does_not_narrow_is_refused_identically_by_every_tp_rank(
    plain: Path, tmp_path: Path, row: int
) -> None:
    a = tensors(plain)[CONV].astype(np.float32)  # exact: BF16 widens to F32
    a[row, 0, 2] = np.float32(1 + 2**-12)  # BF16 keeps 8 bits of mantissa: this one rounds
    d = copy_with(plain, tmp_path / "c", {CONV: a})
    seen = {(tp, r): verdict(d, tp, r) for tp, r in LAYOUTS_TP}
    assert len(set(seen.values())) == 1, seen
    where = [row % a.shape[0], 0, 2]
    assert seen[1, 0] == (
        f"layer 0: {CONV} is stored as F32; converting it to BF16 would "
        f"change element {where} from 1.000244140625 to 1.0 — refused (a conversion is exact "
        "or not done)"
    )


def test_a_conv_that_narrows_exactly_binds_at_every_tp_rank_and_counts_the_extra_reads(
    plain: Path, tmp_path: Path
) -> None:
    a = tensors(plain)[CONV].astype(np.float32)
    d = copy_with(plain, tmp_path / "c", {CONV: a})
    whole = a.nbytes
    for tp, r in LAYOUTS_TP:
        slot = bind(d, tp, r).layers[0].slots["attention"].report
        assert slot.cast == ["self_attn.q_conv1d.weight: F32 -> BF16"]
        assert slot.verdict_bytes == whole - whole // tp  # the rows this rank does not bind


def test_a_narrowed_tensor_over_the_bound_is_checked_per_rank_and_the_refusal_says_so(
    plain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = tensors(plain)[CONV].astype(np.float32)
    a[5, 0, 2] = np.float32(1 + 2**-12)
    d = copy_with(plain, tmp_path / "c", {CONV: a})
    monkeypatch.setattr(checks, "WHOLE_CHECK_BYTES", a.nbytes - 1)
    msg = verdict(d, 2, 0)
    assert "checked on this rank's slice only" in msg
    assert f"{a.nbytes} B is over the {a.nbytes - 1} B bound" in msg
    assert verdict(d, 2, 1) == "bound"
