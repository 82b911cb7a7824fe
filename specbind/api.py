"""The public Python API: ``specbind.open(path)`` -> ``.audit()``, ``.plan()``, ``.bind()``.

Invariants:
- everything the CLI checks, the API checks: the same layout, geometry, plan and binders run,
  and every refusal is a ``SpecbindError`` (one line naming what and where);
- ``bind`` returns the whole model or raises, never a partial result;
- the backend decides the tensor type: ``numpy`` gives ``numpy.ndarray`` (BF16 as
  ``ml_dtypes.bfloat16``), ``cupy`` gives ``cupy.ndarray`` on the device (BF16 as ``uint16``
  bits), ``torch`` gives ``torch.Tensor`` with the field's dtype (``torch.bfloat16``, ...),
  sharing memory where it can (``specbind.runtime.bind.to_torch`` says when it copies).
Trap: importing ``specbind`` imports only this module's standard-library needs; NumPy, the
generated tables and torch load on first use, so ``python -m specbind`` starts fast.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

from specbind.core.record import record
from specbind.runtime.bind.bind_options import BindOptions

if TYPE_CHECKING:
    import numpy.typing as npt
    import torch

    from specbind.runtime.bind.bind import BindResult
    from specbind.runtime.binder.backends import Arena
    from specbind.runtime.binder.checks import BindReport
    from specbind.runtime.binder.tables import ModelTable
    from specbind.runtime.bound.reload import BoundFile
    from specbind.runtime.io.checkpoint import CheckpointDir

T = TypeVar("T")
W = TypeVar("W")
BackendName = Literal["numpy", "cupy", "torch"]


@record
class BoundSlot(Generic[T]):
    """One slot of one layer (or the model-level ``globals``): its block and bound fields."""

    slot: str
    block: str
    weights: Any  # the generated ``<Block>Weights`` record, holding T; see ``weights_as``
    tensors: dict[str, T]  # field name -> tensor, as ``weights.arrays()``
    dtypes: dict[str, str]  # field name -> safetensors dtype (BF16, F32, F8_E4M3, ...)
    report: BindReport

    def weights_as(self, kind: type[W]) -> W:
        """The typed weights, e.g. ``slot.weights_as(DsaWeights)``; refused if the slot holds
        another block's weights."""
        if not isinstance(self.weights, kind):
            from specbind.core.errors import BindError

            raise BindError(
                f"slot {self.slot!r} holds {self.block!r} weights "
                f"({type(self.weights).__name__}), not {kind.__name__}"
            )
        return self.weights


@record
class BoundLayer(Generic[T]):
    index: int
    role: str  # "decoder" | "mtp"
    slots: dict[str, BoundSlot[T]]


@record
class BoundModel(Generic[T]):
    """This rank's share of the whole model, in the layout the kernels read."""

    model: str
    tp_size: int
    tp_rank: int
    ep_size: int
    ep_rank: int
    backend: str
    layers: list[BoundLayer[T]]
    globals: BoundSlot[T] | None
    result: BindResult  # the reports; ``result.as_dict()`` is ``bind --json``

    def tensors(self) -> dict[str, T]:
        """Every bound field by its ``--out`` name (``layers.3.mlp.w13``, ``globals.norm``)."""
        out: dict[str, T] = {}
        for layer in self.layers:
            for name, slot in layer.slots.items():
                out.update({f"layers.{layer.index}.{name}.{k}": v for k, v in slot.tensors.items()})
        if self.globals is not None:
            out.update({f"globals.{k}": v for k, v in self.globals.tensors.items()})
        return out


class Checkpoint:
    """A checkpoint directory (or Hub snapshot) opened against one generated model table.

    Opening reads the index, the safetensors headers and ``config.json``; no tensor bytes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        model: str | None = None,
        overrides: Mapping[str, int] | None = None,
    ) -> None:
        from specbind.hub import resolve
        from specbind.runtime.io.checkpoint import CheckpointDir
        from specbind.runtime.layout.config import values_from_config

        given = _path_arg("open", path)
        _name_arg("open", "model", model)
        self.overrides: dict[str, int] = _overrides_arg(overrides)
        # a Hub id (owner/name) that is no path on disk: its snapshot in the local Hub cache,
        # as the CLI reads it (``ck.path`` says which; the API writes nothing on stderr)
        self._raw: CheckpointDir = CheckpointDir(Path(resolve(given, note=False)))
        self._table: ModelTable[Any] = model_table(model, "model=", self._raw.config)
        self.values: dict[str, int] = values_from_config(
            self._table, self._raw.config, self.overrides
        )  # a bad config or override is refused at open, before any work

    @property
    def path(self) -> Path:
        return self._raw.root

    @property
    def model(self) -> str:
        return self._table.name

    @property
    def config(self) -> dict[str, Any]:
        return self._raw.config

    def audit(self, *, mtp: bool = True) -> dict[str, Any]:
        """The census ``specbind audit --json`` prints: coverage, per-layer slots, problems
        (``mtp=False``: as ``audit --no-mtp``, the decoder alone)."""
        from specbind.audit import audit

        return audit(self._raw, self._table, progress=False, overrides=self.overrides, mtp=mtp)

    def plan(self, *, tp_size: int = 1, ep_size: int = 1, mtp: bool = True) -> dict[str, Any]:
        """Every tensor's local shape and bytes on every rank: ``specbind plan --json``
        (``mtp=False``: the decoder alone, as ``--no-mtp``)."""
        from specbind.core.rank_args import check_size
        from specbind.plan_report import checkpoint_layers, plan_report

        tp_size, ep_size = check_size("plan", tp_size), check_size("plan", ep_size, "ep")
        layers, quant, source = checkpoint_layers(self._table, self._raw, self.values, mtp)
        return plan_report(
            self._table, self.values, tp_size, layers, source, ep_size=ep_size,
            quant=lambda i, b: quant.get((i, b)),
        )  # fmt: skip

    @overload
    def bind(
        self,
        *,
        tp_rank: int | None = ...,
        tp_size: int = ...,
        ep_rank: int | None = ...,
        ep_size: int = ...,
        backend: Literal["numpy"] = ...,
        device: str | None = ...,
        progress: bool | None = ...,
        options: BindOptions | None = ...,
        quant_output: str | Sequence[str] | None = ...,
        allow_unshared_scales: bool | None = ...,
        mtp: bool | None = ...,
        into: Arena | None = ...,
    ) -> BoundModel[npt.NDArray[Any]]: ...

    @overload
    def bind(
        self,
        *,
        tp_rank: int | None = ...,
        tp_size: int = ...,
        ep_rank: int | None = ...,
        ep_size: int = ...,
        backend: Literal["torch"],
        device: str | None = ...,
        progress: bool | None = ...,
        options: BindOptions | None = ...,
        quant_output: str | Sequence[str] | None = ...,
        allow_unshared_scales: bool | None = ...,
        mtp: bool | None = ...,
        into: Arena | None = ...,
    ) -> BoundModel[torch.Tensor]: ...

    @overload
    def bind(
        self,
        *,
        tp_rank: int | None = ...,
        tp_size: int = ...,
        ep_rank: int | None = ...,
        ep_size: int = ...,
        backend: Literal["cupy"],
        device: str | None = ...,
        progress: bool | None = ...,
        options: BindOptions | None = ...,
        quant_output: str | Sequence[str] | None = ...,
        allow_unshared_scales: bool | None = ...,
        mtp: bool | None = ...,
        into: Arena | None = ...,
    ) -> BoundModel[Any]: ...

    def bind(
        self,
        *,
        tp_rank: int | None = None,
        tp_size: int = 1,
        ep_rank: int | None = None,
        ep_size: int = 1,
        backend: BackendName = "numpy",
        device: str | None = None,
        progress: bool | None = None,
        options: BindOptions | None = None,
        quant_output: str | Sequence[str] | None = None,
        allow_unshared_scales: bool | None = None,
        mtp: bool | None = None,
        into: Arena | None = None,
    ) -> BoundModel[Any]:
        """Bind this rank's share of every tensor.

        ``tp_rank`` / ``ep_rank``: this process's ranks, required where the size is above 1
        (never read as rank 0).

        The binding options are the CLI's ``bind`` flags: ``options=BindOptions(...)``
        (``specbind.BindOptions``), or the same names as keywords, not both —
        ``quant_output`` (``"swizzled"``, ``"dequantized"``, or a list: ``--quant-output``),
        ``allow_unshared_scales`` (``--allow-unshared-scales``), ``progress`` (a bar on
        stderr; default none), ``mtp`` (False: the decoder alone, as ``--no-mtp``).

        ``device``: for ``cupy``, the CUDA device index as ``"cuda:N"`` (default: the current
        one); for ``torch``, where the tensors live: ``None``/``"cpu"`` binds with NumPy and
        shares host memory; ``"cuda[:N]"`` binds with CuPy when it is installed and hands the
        device arrays to torch through DLPack, else binds on the host and copies once.

        ``into``: an ``Arena`` (``specbind.Arena()``, host memory) every field is bound into,
        each byte written once: a stacked or computed field is made there, a field that would
        be a view of the mapped checkpoint is copied there (numpy, or torch on the host).
        Without it, a numpy field that is a slice of one stored tensor is a read-only view of
        the file's map: the file must not be rewritten or truncated while it lives (the guide's
        "Which results are views of the files").
        """
        from specbind.core.errors import SpecbindError, UsageError
        from specbind.core.rank_args import check_ranks
        from specbind.core.shown import shown
        from specbind.runtime.bind.bind import bind_checkpoint
        from specbind.runtime.binder import backends

        tp_size, tp_rank = check_ranks("bind", tp_size, tp_rank)
        ep_size, ep_rank = check_ranks("bind", ep_size, ep_rank, "ep")
        if not isinstance(backend, str) or backend not in ("numpy", "cupy", "torch"):
            raise UsageError(f"bind: unknown backend {shown(backend)} (numpy, cupy or torch)")
        if device is not None and (
            not isinstance(device, str) or not re.fullmatch(r"cpu|cuda(:[0-9]{1,3})?", device)
        ):
            raise UsageError(
                f"bind: device {shown(device)}: expected 'cpu', 'cuda' or 'cuda:N' (a str), or None"
            )
        if into is not None and not isinstance(into, backends.Arena):
            raise UsageError(
                f"bind: into has type {type(into).__name__}; expected None or a specbind.Arena()"
            )
        on_gpu = device is not None and device.startswith("cuda")
        if backend == "numpy" and on_gpu:
            raise SpecbindError(f"backend 'numpy' lives on the host, not on device {device!r}")
        if backend == "cupy" and device == "cpu":
            raise SpecbindError("backend 'cupy' lives on a CUDA device, not on 'cpu'")
        if backend == "torch":
            from specbind.runtime.bind.to_torch import torch_module

            tm = torch_module()  # refuse a missing torch, or a device it lacks, before any work
            if on_gpu and not _has_cupy() and not tm.cuda.is_available():
                raise SpecbindError(f"device {device!r}: torch sees no CUDA device here")
        engine = "cupy" if backend == "cupy" or (on_gpu and _has_cupy()) else "numpy"
        be = backends.get(engine, _kernels() if engine == "cupy" else None)
        opts = _bind_options(options, quant_output, allow_unshared_scales, progress, mtp)
        with _cuda_device(device if engine == "cupy" else None):
            result = bind_checkpoint(
                self._raw, self._table, self.overrides, tp_size, tp_rank, backend=be,
                ep_size=ep_size, ep_rank=ep_rank, into=into, **opts.bind_kwargs(),
            )  # fmt: skip
        convert = _converter(backend, device)
        layers = [
            BoundLayer(x.index, x.role, {n: _slot(s, convert) for n, s in x.slots.items()})
            for x in result.layers
        ]
        glob = None if result.globals is None else _slot(result.globals, convert)
        r = result.ranks
        return BoundModel(
            self._table.name, r.tp_size, r.tp_rank, r.ep_size, r.ep_rank, backend, layers, glob,
            result,
        )  # fmt: skip


def _bind_options(
    options: BindOptions | None,
    quant_output: str | Sequence[str] | None,
    allow_unshared_scales: bool | None,
    progress: bool | None,
    mtp: bool | None = None,
) -> BindOptions:
    """``options``, or one made of the keywords given; both at once is refused."""
    from specbind.core.errors import SpecbindError
    from specbind.runtime.bind.bind_options import BindOptions

    given: dict[str, Any] = {
        k: v
        for k, v in (
            ("quant_output", quant_output),
            ("allow_unshared_scales", allow_unshared_scales),
            ("progress", progress),
            ("mtp", mtp),
        )
        if v is not None
    }
    if options is None:
        return BindOptions(**given)
    if not isinstance(options, BindOptions):
        raise SpecbindError(f"options is {type(options).__name__}, expected a BindOptions")
    if given:
        raise SpecbindError(f"bind: give options= or the keyword(s) {', '.join(given)}, not both")
    return options


def open(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    overrides: Mapping[str, int] | None = None,
) -> Checkpoint:
    """Open a checkpoint directory, or a Hub id (``"owner/name"``, not a path on disk) from the
    local Hub cache as the CLI reads it (``Checkpoint.path`` is the snapshot read); ``model``
    picks a generated model when several exist; ``overrides`` (a mapping of names to ints)
    replaces geometry values as ``--set`` does. An argument of the wrong type is one
    ``UsageError`` line, before anything is read."""
    return Checkpoint(path, model, overrides)


def open_bound(
    path: str | os.PathLike[str],
    *,
    model: str | None = None,
    tp_size: int | None = None,
    tp_rank: int | None = None,
    ep_size: int | None = None,
    ep_rank: int | None = None,
    copy: bool = False,
) -> BoundFile:
    """A rank's ``bind --out`` file loaded back: its spec hash, model, geometry, ranks and
    layer kinds checked against these binders (and the ranks asked for), then views of the
    mapped file (the file must not change while they live), or copies with ``copy=True``. See
    ``specbind.runtime.bound.reload``."""
    # a wrapper, not a re-export: importing runtime.bound.reload at `import specbind` loads NumPy;
    # and the one place that hands the reader the generated tables it checks against
    from specbind.core.rank_args import as_int
    from specbind.generated import MODELS, SPECS_SHA256
    from specbind.runtime.bound.reload import read_bound

    path = _path_arg("open_bound", path)
    _name_arg("open_bound", "model", model)
    if type(copy) is not bool:
        from specbind.core.errors import UsageError
        from specbind.core.shown import shown

        raise UsageError(f"open_bound: copy={shown(copy)} is not a bool (True or False)")
    given = {"tp_size": tp_size, "tp_rank": tp_rank, "ep_size": ep_size, "ep_rank": ep_rank}
    tp_size, tp_rank, ep_size, ep_rank = (
        None if v is None else as_int("open_bound", k, v) for k, v in given.items()
    )
    return read_bound(
        path, models=MODELS, specs_sha256=SPECS_SHA256, model=model, tp_size=tp_size,
        tp_rank=tp_rank, ep_size=ep_size, ep_rank=ep_rank, copy=copy,
    )  # fmt: skip


def _path_arg(where: str, path: object) -> str:
    """A path argument as the text of a path: a ``str`` or an ``os.PathLike`` of one, without a
    NUL byte; anything else (None, an int, bytes) is one ``UsageError`` line, not a raw
    ``TypeError`` from deep inside ``pathlib``."""
    from specbind.core.errors import UsageError
    from specbind.core.shown import shown

    text = os.fspath(path) if isinstance(path, os.PathLike) else path
    if not isinstance(text, str):  # bytes paths too: every message and check reads text
        raise UsageError(
            f"{where}: path {shown(path)} has type {type(text).__name__}; expected a path as a "
            "str or os.PathLike (of a str)"
        )
    if "\0" in text:
        raise UsageError(f"{where}: path {shown(text)} holds a NUL byte; no file is named so")
    if text == "":
        raise UsageError(f"{where}: path '' is empty; give the checkpoint's directory")
    return text


def _name_arg(where: str, name: str, value: object) -> None:
    """A name argument (``model=``): None or a ``str``."""
    if value is not None and not isinstance(value, str):
        from specbind.core.errors import UsageError
        from specbind.core.shown import shown

        raise UsageError(
            f"{where}: {name}={shown(value)} has type {type(value).__name__}; "
            "expected a str or None"
        )


def _overrides_arg(overrides: object) -> dict[str, int]:
    """``overrides=`` as a dict: None, or a mapping of names to values (each value's type is
    checked with the geometry: ``layout.config.checked_values``)."""
    from specbind.core.errors import OverrideError
    from specbind.core.shown import shown

    if overrides is None:
        return {}
    if not isinstance(overrides, Mapping):
        raise OverrideError(
            f"open: overrides={shown(overrides)} has type {type(overrides).__name__}; expected "
            "a mapping of geometry names to integers (overrides={'hidden': 40})"
        )
    bad = next((k for k in overrides if not isinstance(k, str)), None)
    if bad is not None:
        raise OverrideError(f"open: overrides key {shown(bad)} is not a str (a geometry name)")
    return dict(overrides)


def model_table(
    name: str | None,
    how: str = "model=",
    config: Mapping[str, Any] | None = None,
    advice: str | None = None,
) -> ModelTable[Any]:
    """The generated table of model ``name``; without a name, the only model, else for a
    checkpoint (``config``: its config.json) the one whose ``model_types`` hold its
    ``model_type`` (flat or under ``text_config``), else — no checkpoint at all (``synth``,
    ``bench``, ``plan`` of the spec) — the spec marked ``default``.

    A checkpoint whose config names no model type, a non-string one, or one no generated model
    claims is refused naming the known model types and ``how`` to choose one (``--model``,
    ``model=``): a default model would only be refused later by a field it lacks."""
    from specbind.core.errors import SpecbindError, UsageError
    from specbind.core.shown import shown
    from specbind.generated import MODELS

    # each model's model_types and default flag, from the registry: no table imported to pick
    types = {n: e.model_types for n, e in MODELS.entries.items()}
    if name is not None:
        if name not in MODELS:
            raise UsageError(f"unknown model {shown(name)} (generated: {', '.join(MODELS)})")
        if config is not None:
            _not_anothers(types, name, config, how)
        return MODELS[name]
    if len(MODELS) == 1:
        return next(iter(MODELS.values()))
    if config is not None:
        return MODELS[_by_model_type(types, config, how, advice)]
    pick = next((n for n, e in MODELS.entries.items() if e.default), None)
    if pick is None:
        raise SpecbindError(
            f"several models are generated; pick one with {how} ({', '.join(MODELS)})"
        )
    return MODELS[pick]


def _model_types(config: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(where, value) of each ``model_type`` config.json holds, flat and under text_config."""
    nested = config.get("text_config")
    found = [("model_type", config["model_type"])] if "model_type" in config else []
    if isinstance(nested, dict) and "model_type" in nested:
        found.append(("text_config.model_type", nested["model_type"]))
    return found


def _not_anothers(
    types: Mapping[str, tuple[str, ...]], name: str, config: Mapping[str, Any], how: str
) -> None:
    """Refuse a model chosen by hand for a checkpoint whose ``model_type`` another generated
    model claims (and this one does not): bound as the wrong model, it would be refused later
    by some geometry field, naming neither model. A type no model claims is the user's call."""
    from specbind.core.errors import CheckpointError
    from specbind.core.shown import shown

    kinds = {k for _, k in _model_types(config) if isinstance(k, str)}
    if not kinds or kinds & set(types[name]):
        return
    owners = sorted(n for n, t in types.items() if kinds & set(t))
    if owners:
        said = " and ".join(shown(k) for k in sorted(kinds))
        given = f"{how}{'' if how.endswith('=') else ' '}{name}"
        raise CheckpointError(
            f"{given}: config.json model_type {said} {'are' if len(kinds) > 1 else 'is'} "
            f"{' and '.join(owners)}'s, not "
            f"{name}'s ({', '.join(types[name]) or 'no model type'}); "
            f"leave the model out to bind it as {owners[0]}"
        )


def _by_model_type(
    types: Mapping[str, tuple[str, ...]],
    config: Mapping[str, Any],
    how: str,
    advice: str | None = None,
) -> str:
    """The name of the one model whose ``model_types`` hold the checkpoint's ``model_type``;
    ``advice`` replaces "choose the model with ``how`` NAME" where the caller has no way to
    name a model (inside vLLM)."""
    from specbind.core.errors import CheckpointError
    from specbind.core.shown import shown

    found = _model_types(config)
    known = "; ".join(f"{', '.join(t) or '(none)'} -> {n}" for n, t in types.items())
    choose = advice or f"choose the model with {how}{'' if how.endswith('=') else ' '}NAME"
    for where, kind in found:
        if not isinstance(kind, str):
            raise CheckpointError(
                f"config.json: {where} is {shown(kind)} ({type(kind).__name__}), not a string; "
                f"known model types: {known}; {choose}"
            )
    kinds = {k for _, k in found}
    if not kinds:
        raise CheckpointError(
            f"config.json: no model_type (flat or under text_config), so no model is picked "
            f"for it; known model types: {known}; {choose}"
        )
    hits = [n for n, t in types.items() if kinds & set(t)]
    if len(hits) != 1:
        said = " and ".join(shown(k) for k in sorted(kinds))
        which = "no generated model claims" if not hits else "several generated models claim"
        raise CheckpointError(
            f"config.json: model_type {said}: {which} it; known model types: {known}; {choose}"
        )
    return hits[0]


def _has_cupy() -> bool:
    import importlib

    try:
        importlib.import_module("cupy")
    except ImportError:
        return False
    return True


def _kernels() -> Any:
    from specbind.generated import kernels

    return kernels


class _cuda_device:
    """``with cupy.cuda.Device(n)`` for ``"cuda:n"``; nothing for ``None`` or ``"cuda"``."""

    def __init__(self, device: str | None) -> None:
        self._ctx: Any = None
        if device is not None and ":" in device:
            import importlib

            cp = importlib.import_module("cupy")
            self._ctx = cp.cuda.Device(int(device.split(":", 1)[1]))

    def __enter__(self) -> None:
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)


def _converter(backend: str, device: str | None) -> Any:
    if backend != "torch":
        return lambda a, dtype: a
    from specbind.runtime.bind.to_torch import to_torch

    return lambda a, dtype: to_torch(a, dtype, device)


def _slot(s: Any, convert: Any) -> BoundSlot[Any]:
    from specbind.runtime.binder.tables import map_arrays

    dtypes = {name: s.fields[name].dtype for name in s.weights.arrays()}
    weights = map_arrays(s.weights, lambda name, a: convert(a, dtypes[name]))
    return BoundSlot(s.slot, s.block, weights, weights.arrays(), dtypes, s.report)
