"""Every refusal names the stored tensor, by the name the checkpoint's own index uses, in full
(layer and member index included), never by a spec-internal name alone; and its explanation
fits the family it refuses.

Each family (every generated model) is synthesized tiny and written under its writers' names
(``stored_names``: every ``names`` rule read backwards: prefix and whole-name renames,
member-indexed renames, sections, equal segments, stacked members, model-level renames), then
one stored tensor at a time is mutated (``refusal_cases``: wrong dtype, a value its dtype
cannot hold, wrong shape, missing, an extra tensor beside it, a member past its family, a
header that claims bytes the file lacks). ``bind`` must refuse (or accept) in one line naming
the stored tensor; ``audit``, ``plan`` (names only) and an engine bind (vLLM's layout) must
too, on the renamed ones.
Affordable on two cores: every stored tensor read through a rename, plus a sample of three
others a family (at least one model-level), each in one layer.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import refusal_cases as rc
from stored_names import stored_checkpoint

from specbind.audit import audit
from specbind.core.errors import SpecbindError
from specbind.core.patterns import layer_pattern
from specbind.generated import MODELS
from specbind.generated.engines import ENGINES
from specbind.runtime.bind.bind import ReportOnly, bind_checkpoint
from specbind.runtime.bind.preamble import NamedView, geometry_of
from specbind.runtime.io.checkpoint import CheckpointDir

WORDS = rc.family_words(list(MODELS))
PLAIN = 3  # stored tensors a family is sampled at besides every renamed one


class Family:
    """One family's stored checkpoint, its kinds of stored tensor, and the names a refusal
    must not use."""

    def __init__(self, model: str, root: Path) -> None:
        self.model = model
        self.table = MODELS[model]
        self.root = root
        self.tensors = stored_checkpoint(self.table, root / "stored")
        self.config = json.loads((root / "stored" / "config.json").read_text())
        ckpt = CheckpointDir(root / "stored")
        view = NamedView(
            ckpt, self.table.layer_pattern, self.table.names, None,
            geometry_of(ckpt, self.table), self.table.layer_prefixes,
        )  # fmt: skip
        names = view.names()
        self.renamed = {view.on_disk(n) for n in names if view.on_disk(n) != n}
        stored_rel = {self._rel(n) for n in self.tensors}
        internal = {self._rel(n) for n in names} - stored_rel
        # a spec-internal name with any layer or member index: mlp.experts.#.gate_proj.weight
        self.internal = {
            re.escape(rc.INDEX.sub("#", n)).replace("\\#", "[0-9]+").replace("#", "[0-9]+")
            for n in internal
        }
        self.blocks = {b.name for b in self.table.blocks}
        kinds = rc.kinds(list(self.tensors))
        renamed = {k: n for k, n in kinds.items() if n in self.renamed}
        plain = [n for k, n in kinds.items() if k not in renamed]
        outside = [n for n in plain if layer_pattern(self.table.layer_pattern).split(n) is None]
        inside = [n for n in plain if n not in outside]
        step = max(1, len(inside) // PLAIN)
        self.sample = sorted({*renamed.values(), *outside[:1], *inside[::step][: PLAIN - 1]})

    def _rel(self, name: str) -> str:
        hit = layer_pattern(self.table.layer_pattern).split(name)
        if hit is not None:
            return hit[2]
        for p in sorted(self.table.layer_prefixes, key=len, reverse=True):
            if p and name.startswith(p):
                return name[len(p) :]
        return name

    def members(self, name: str) -> int | None:
        """The size of the family a member-indexed stored name belongs to, else None."""
        idx = rc.INDEX.findall(name)
        if len(idx) < 2:
            return None
        key = rc.INDEX.sub("#", name)
        same = {
            rc.INDEX.findall(n)[-1]
            for n in self.tensors
            if rc.INDEX.sub("#", n) == key and rc.INDEX.findall(n)[:-1] == idx[:-1]
        }
        return len(same)

    def judge(self, msg: str, want: str) -> str | None:
        return rc.judge(msg, want, self.internal, self.model, WORDS, self.blocks)


def _refusal(call: Any) -> str | None:
    """The refusal ``call`` raises, or None when it accepts."""
    try:
        call()
    except SpecbindError as e:
        return str(e)
    return None


def _bind(path: Path, table: Any) -> None:
    bind_checkpoint(CheckpointDir(path), table, progress=False, sink=ReportOnly())


def _audit(path: Path, table: Any) -> None:
    rep = audit(CheckpointDir(path), table, progress=False, verify=False, identical=False)
    if not rep["ok"]:
        raise SpecbindError(rep["verdict"])


def _plan(path: Path, table: Any) -> None:
    from specbind.plan_report import checkpoint_layers
    from specbind.runtime.layout.config import values_from_config

    ckpt = CheckpointDir(path)
    checkpoint_layers(table, ckpt, values_from_config(table, ckpt.config))


def _engine(path: Path, model: str) -> None:
    from specbind.engine import bind_for_engine

    bind_for_engine(path, "vllm", model=model)


def check_family(model: str, root: Path) -> tuple[list[str], int]:
    """(each failure, one line each; how many refusals were judged) over the family's
    sampled stored tensors and every mutation that applies to each."""
    fam = Family(model, root)
    failures: list[str] = []
    judged = 0
    k = 0
    for name in fam.sample:
        for how in rc.MUTATIONS:
            mutated = rc.mutate(fam.tensors, name, how, fam.members)
            if mutated is None:
                continue
            tensors, want, short = mutated
            k += 1
            path = root / f"m{k}"
            rc.write(tensors, path, fam.config, short)
            calls = [("bind", lambda p=path: _bind(p, fam.table))]
            if name in fam.renamed and how in ("dtype", "missing", "extra"):
                calls.append(("audit", lambda p=path: _audit(p, fam.table)))
                calls.append(("plan", lambda p=path: _plan(p, fam.table)))
                if ("vllm", model) in ENGINES:
                    calls.append(("engine", lambda p=path: _engine(p, model)))
            for what, call in calls:
                try:
                    msg = _refusal(call)
                except Exception as e:  # not a refusal: a crash is a failure too
                    failures.append(f"{what} {how} {name}: {type(e).__name__}: {e}")
                    continue
                if msg is None:
                    continue  # accepted (an optional tensor dropped, a dtype converted)
                judged += 1
                why = fam.judge(msg, want)
                if why is not None:
                    failures.append(f"{what} {how} {name}: {why}: {msg[:300]}")
    return failures, judged


@pytest.mark.parametrize("model", sorted(MODELS))
def test_a_mutated_stored_tensor_is_refused_naming_it_as_the_checkpoint_stores_it(
    model: str, tmp_path: Path
) -> None:
    failures, judged = check_family(model, tmp_path)
    assert judged >= 10, f"only {judged} refusals judged: the mutations must reach the family"
    assert not failures, f"{len(failures)} refusal(s):\n" + "\n".join(failures[:12])


def test_the_sample_reaches_every_rename_of_every_family(tmp_path: Path) -> None:
    """Every ``names`` rule of every family is read through by some sampled stored tensor,
    and each kind of rename occurs in some family."""
    kinds: set[str] = set()
    for model, table in sorted(MODELS.items()):
        if not table.names:
            continue
        fam = Family(model, tmp_path / model)
        ckpt = CheckpointDir(tmp_path / model / "stored")
        for r in table.names:
            kind = (
                "model" if r.scope == "model" else "unstack" if r.unstack
                else ("sections" if r.sizes else "segments") if len(r.to) > 1
                else "member" if "{" in r.source
                else "prefix" if r.source.endswith((".", "_")) else "whole"
            )  # fmt: skip
            kinds.add(kind)
            one = NamedView(
                ckpt, table.layer_pattern, (r,), None, geometry_of(ckpt, table),
                table.layer_prefixes,
            )  # fmt: skip
            through = {one.on_disk(n) for n in one.names() if one.on_disk(n) != n}
            assert through & set(fam.sample), f"{model}: no sampled tensor is read by {r}"
    assert kinds == {"model", "unstack", "sections", "segments", "member", "prefix", "whole"}
