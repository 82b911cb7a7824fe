"""specbind as a vLLM model loader: ``vllm.LLM(model=CKPT, load_format="specbind")``.

Installing specbind registers the loader through the ``vllm.general_plugins`` entry point
(pyproject), which vLLM runs in every one of its processes, tp workers included. On each rank
the loader binds that rank's share with the generated vLLM layout of the checkpoint's model
(``specs/engines/vllm/<model>.yaml``): every tensor checked, only the rank's bytes read, and
every field becomes the storage of the vLLM parameter of its name (``specbind.engine.fill``
with ``adopt``: every parameter filled exactly once, equal shape and dtype, nothing left over):
- a field that is one contiguous run of a checkpoint file's bytes (a verbatim tensor, a row
  shard, ``gate_proj`` then ``up_proj`` as the file stores them) is that run of a private,
  copy-on-write map of the file, every page mapped in before ``load_weights`` returns
  (``Arena(file_views=True)``, ``runtime.io.safetensors_file.private_view``): no byte
  copied, the page cache's pages shared by every rank and process that reads the file;
- every other field (a fused ``qkv_proj``, stacked experts, a column shard, a padded share) is
  bound straight into memory of its own, each byte written once (``Arena(separate=True)``,
  large reads split over the rank's cores); on the first load of a model that memory is the
  storage vLLM allocated for its parameters (``Arena.donate``), whose pages an earlier engine
  of the process may have faulted in already.
``model_loader_extra_config={"mmap": False}`` copies the file-run fields too (see the traps).
vLLM's own post-processing (``process_weights_after_loading``: its MLA absorbs, kernel
repacking) stays vLLM's.

Invariants:
- a refused checkpoint fails engine start with specbind's one-line message (a
  ``SpecbindError``), before any parameter is written; its census (every tensor claimed,
  none missing), dtypes and config are checked at the top of the loader's ``load_model``,
  before vLLM builds the model (``specbind.engine_check``; vLLM 0.32 never calls
  ``download_model`` on a worker's path), the shapes and values by the bind after it; under
  vLLM's multi-process engine (its default, tp > 1, the server) that line is raised in the
  caller's process too, as the ``SpecbindError`` of the failed start (``_relay``), not only
  left in a worker's log;
- tp size and rank come from vLLM's parallel state, never from the user;
- what this loader does not do (pipeline parallelism, expert parallelism over more than one
  rank, a Hub id vLLM has not resolved to a local folder) is refused in one line rather than
  loaded some other way; ``enable_expert_parallel`` at tp 1 and dp 1 (one expert rank, the
  layout vLLM's own loader binds then) is accepted.
Trap: Python's cyclic garbage collector is off while a rank binds and fills (back on after,
as it was): the bind allocates many small records, and each collection they set off walks the
whole heap of the engine's process (vLLM, torch, the model): in a fresh process that has
imported torch, finding the model table and its vLLM layout alone took 0.20 s of one core
against 0.04 s with collection off; the bind makes no garbage
that needs the cycle collector (a bind of the 4.2 GB Qwen3-MoE bench checkpoint at tp 2
leaves none: `gc.collect()` after it finds 0 unreachable objects).
Trap (``mmap``, the default): a parameter that is the file's pages needs the file as it was:
a checkpoint truncated or rewritten in place while the engine runs gives SIGBUS or the new
bytes (a Hub cache's blobs never are; a folder a trainer rewrites in place is: load it with
``"mmap": False``), and under memory pressure the kernel may drop those clean pages and read
them from the disk again later (anonymous memory, with no swap, would stay).
Trap: only the first load of a model (vLLM's ``load_model``) binds into its parameters'
storage: a later ``load_weights`` into a running model (a weight reload) binds into memory of
its own, so a reload refused mid-bind leaves the running parameters as they were.
Trap: vLLM is imported only inside ``register`` and the loader's methods, so importing
specbind never needs vLLM.
Trap: a worker's exception does not cross vLLM's process boundary (the caller gets "Engine
core initialization failed. See root cause above."), so the refusing worker appends its line
to a file the first process named in the environment (``RELAY``, inherited by every process
vLLM starts), and that process, where vLLM waits for its engine to start, raises it.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import functools
import gc
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from specbind.core.errors import SpecbindError

LOAD_FORMAT = "specbind"
ENGINE = "vllm"


def register() -> None:
    """The ``vllm.general_plugins`` entry point: register ``load_format="specbind"``."""
    from vllm.model_executor.model_loader import register_model_loader
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    class SpecbindLoader(BaseModelLoader):  # type: ignore[misc]
        """Binds this rank's share with specbind and copies it into vLLM's parameters."""

        def download_model(self, model_config: Any) -> None:
            try:
                _local_dir(model_config.model)
            except SpecbindError as e:
                _report(e)
                raise

        def load_model(self, vllm_config: Any, model_config: Any, *args: Any, **kw: Any) -> Any:
            try:  # before vLLM builds the model: a refusal costs no model construction
                check_before_build(model_config.model)
            except SpecbindError as e:
                _report(e)
                raise
            token = _INITIAL.set(True)  # a model vLLM has just made: its parameters hold nothing
            try:
                return super().load_model(vllm_config, model_config, *args, **kw)
            finally:
                _INITIAL.reset(token)

        def load_weights(self, model: Any, model_config: Any) -> None:
            try:
                options = loader_options(self.load_config.model_loader_extra_config)
            except SpecbindError as e:
                _report(e)
                raise
            load_weights(model, model_config, **options)

    try:
        register_model_loader(LOAD_FORMAT)(SpecbindLoader)
    except Exception as e:  # registered already in this process (vLLM may run plugins twice)
        if "already" not in str(e).lower():
            raise
    if RELAY not in os.environ:  # the first vLLM process: its engine's refusals come here
        import tempfile

        fd, path = tempfile.mkstemp(prefix="specbind-vllm-", suffix=".refusals")
        os.close(fd)
        atexit.register(_unlink, path)
        os.environ[RELAY] = f"{os.getpid()}:{path}"
        _relay()


RELAY = "SPECBIND_VLLM_REFUSALS"  # "<pid of the first process>:<file of refusal lines>"


def _unlink(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def _relay_file() -> tuple[int, str] | None:
    pid, _, path = os.environ.get(RELAY, "").partition(":")
    return (int(pid), path) if pid.isdigit() and path else None


def _report(e: SpecbindError) -> None:
    """In a process vLLM started, append the refusal's line to the first process's file."""
    where = _relay_file()
    if where is None or where[0] == os.getpid():
        return  # in the caller's own process the exception itself reaches the caller
    with contextlib.suppress(OSError), open(where[1], "a", encoding="utf-8") as f:
        f.write(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}\n")


def take_refusal() -> str | None:
    """The first refusal a process of this engine reported since the last call (and forget
    them all), or None."""
    where = _relay_file()
    if where is None:
        return None
    try:
        with open(where[1], "r+", encoding="utf-8") as f:
            lines = f.read().splitlines()
            f.truncate(0)
    except OSError:
        return None
    return lines[0] if lines else None


def _relay() -> None:
    """Wrap vLLM's wait for its engine processes so that a start failed by specbind raises
    specbind's line (the vLLM error chained under it). Where vLLM has no such function (a
    version that moved it), nothing is wrapped: the line stays in the worker's log."""
    import importlib

    try:
        utils = importlib.import_module("vllm.v1.engine.utils")
    except ImportError:
        return
    wait = getattr(utils, "wait_for_engine_startup", None)
    if wait is None or getattr(wait, "_specbind", False):
        return

    @functools.wraps(wait)
    def wait_for_engine_startup(*args: Any, **kwargs: Any) -> Any:
        take_refusal()  # an earlier engine's, already raised or not ours
        try:
            return wait(*args, **kwargs)
        except Exception as e:
            line = take_refusal()
            if line is None:
                raise
            raise SpecbindError(line) from e  # vLLM's own error chained beneath it

    wait_for_engine_startup._specbind = True  # type: ignore[attr-defined]
    setattr(utils, "wait_for_engine_startup", wait_for_engine_startup)  # noqa: B010


def check_parallel(pp: int, tp: int, dp: int, expert_parallel: bool) -> None:
    """Refuse a parallel layout the vLLM layouts do not bind as vLLM's own loader does."""
    if pp > 1:
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r}: pipeline parallelism is not supported (pp size "
            f"{pp}); use tensor parallelism"
        )
    if expert_parallel and tp * dp > 1:
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r}: expert parallelism over {tp * dp} ranks (tp {tp} x "
            f"dp {dp}) is not supported yet; the vLLM layouts split experts by tensor "
            "parallelism (enable_expert_parallel binds at tp 1 and dp 1, one expert rank)"
        )


VLLM_ADVICE = (
    "specbind has no model spec for it: load it with vLLM's own loader (leave out "
    "load_format='specbind' / --load-format specbind), or add a spec (README: Adding a model)"
)


def _local_dir(model: str) -> Path:
    p = Path(model)
    if not p.is_dir():
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r} reads a local checkpoint directory; {model!r} is not "
            "one, and vLLM did not resolve it to one (download it first, e.g. "
            "`huggingface-cli download`, and pass its folder; or set HF_HUB_OFFLINE=1 for a "
            "model already in the Hub cache)"
        )
    return p


OPTIONS = {"mmap": True}  # model_loader_extra_config keys this loader reads, and defaults
_INITIAL: contextvars.ContextVar[bool] = contextvars.ContextVar("specbind_initial", default=False)


def loader_options(extra: Any) -> dict[str, bool]:
    """The loader's options from vLLM's ``model_loader_extra_config`` (a dict, or None)."""
    got = dict(extra or {}) if isinstance(extra, dict) or extra is None else None
    if got is None:
        raise SpecbindError(
            f"load_format={LOAD_FORMAT!r}: model_loader_extra_config must be a dict, got "
            f"{type(extra).__name__}"
        )
    out = dict(OPTIONS)
    for key, value in got.items():
        if key not in OPTIONS:
            raise SpecbindError(
                f"load_format={LOAD_FORMAT!r}: model_loader_extra_config key {key!r} is not "
                f"one this loader reads (it reads: {', '.join(sorted(OPTIONS))})"
            )
        if not isinstance(value, bool):
            raise SpecbindError(
                f"load_format={LOAD_FORMAT!r}: model_loader_extra_config[{key!r}] must be true "
                f"or false, got {value!r}"
            )
        out[key] = value
    return out


def load_weights(model: Any, model_config: Any, *, mmap: bool = True) -> None:
    """Bind this rank's share of ``model_config.model`` into ``model``'s parameters (``mmap``:
    a parameter that is a contiguous run of a checkpoint file's bytes is that run of a private,
    populated map of the file instead of a copy: see the module's traps)."""
    from vllm.config import get_current_vllm_config
    from vllm.distributed import (
        get_pp_group,
        get_tensor_model_parallel_rank,
        get_tensor_model_parallel_world_size,
    )
    from vllm.logger import init_logger

    from specbind.engine import fill
    from specbind.engine_quant import made_by_engine
    from specbind.runtime.binder.backends import Arena
    from specbind.runtime.io.safetensors_file import cores, split_reads

    parallel = get_current_vllm_config().parallel_config
    tp, rank = get_tensor_model_parallel_world_size(), get_tensor_model_parallel_rank()
    t0 = time.perf_counter()
    collecting = gc.isenabled()
    gc.disable()  # see the module's trap: no full collection of vLLM's heap mid-bind
    try:
        check_parallel(
            get_pp_group().world_size, tp, int(getattr(parallel, "data_parallel_size", 1) or 1),
            bool(getattr(parallel, "enable_expert_parallel", False)),
        )  # fmt: skip
        # each field in a map of its own, or the checkpoint's own pages: what its parameter keeps
        arena = Arena(separate=True, file_views=mmap)
        params = dict(model.named_parameters())
        # the engine's own (a quantized model's KV-cache scale sentinels): kept as made
        left = made_by_engine(ENGINE, _local_dir(model_config.model), params)
        if _INITIAL.get():  # a new model's parameters are memory to bind into (see the trap)
            arena.donate(donors(params, keep=left))
        with split_reads(cores()):  # this rank's cores fault the fresh pages in together
            fields = bind_rank(model_config.model, tp, rank, into=arena)
        nbytes = fill(ENGINE, params, fields, adopt=arena, left=left)
    except SpecbindError as e:
        _report(e)
        raise
    finally:
        if collecting:
            gc.enable()
    init_logger("vllm.model_executor.model_loader.specbind").info(
        "specbind: loading weights took %.2f seconds (%d parameters, %.1f MiB, tp rank %d of %d)",
        time.perf_counter() - t0, len(params), nbytes / 2**20, rank, tp,
    )  # fmt: skip


def donors(params: dict[str, Any], keep: Collection[str] = ()) -> list[Any]:
    """The storage of each host parameter that is its own (contiguous, the whole of a storage
    no other parameter or live tensor holds: ``engine.held_elsewhere``, such as a buffer vLLM
    made as a view of it) as a flat ``uint8`` NumPy view, for the arena to bind into; none of
    ``keep`` (parameters no field fills, whose values the engine made: a field bound into
    their storage would become their value)."""
    import torch

    from specbind.engine import held_elsewhere, shared_storage

    shared = shared_storage(params) | held_elsewhere(params)
    out, seen = [], set()
    for name, p in params.items():
        if name in shared or name in keep or id(p) in seen or p.device.type != "cpu":
            continue
        if not p.is_contiguous():
            continue
        seen.add(id(p))
        n = p.numel() * p.element_size()
        if n == 0 or p.storage_offset() != 0 or p.untyped_storage().nbytes() != n:
            continue
        out.append(p.detach().view(-1).view(torch.uint8).numpy())  # [n] -> [n B]: its storage
    return out


def check_before_build(model: str) -> None:
    """The checkpoint folder ``model``'s census, dtypes and config, checked before vLLM builds
    the model (``specbind.engine_check``: no tensor's bytes read)."""
    from specbind.engine_check import check_before_build as check

    check(_local_dir(model), ENGINE, advice=VLLM_ADVICE)


def bind_rank(model: str, tp: int, rank: int, into: Any = None) -> Any:
    """This tp rank's fields of the checkpoint folder ``model``, by vLLM's parameter names
    (``into``: the ``Arena`` they are bound into)."""
    from specbind.engine import bind_for_engine

    return bind_for_engine(
        _local_dir(model), ENGINE, tp_size=tp, tp_rank=rank, advice=VLLM_ADVICE, into=into
    )
