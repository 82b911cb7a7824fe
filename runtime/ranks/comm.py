"""How the ranks of one bind talk to each other: three metadata collectives, nothing else.

``launched(env)`` says whether this process was started by ``torchrun`` (or anything that sets
torch.distributed's ``env://`` variables: ``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``,
``RANK``). ``TorchComm`` joins that process group — NCCL when this host has a CUDA device
(each rank on ``cuda:LOCAL_RANK``), gloo otherwise — with a timeout on every collective;
``LocalComm`` is the world of one that a plain ``specbind bind --out-dir`` runs in.

Invariants: torch is imported only when a ``TorchComm`` is made, so the single-rank CLI never
loads it (it is only in the interop extra); a collective that fails — a peer died (torchrun
tears the others down; on another node its socket closes), or no peer answered within the
timeout — raises ``DistributedError`` in one line, never hangs and never leaks a traceback.
Trap: mpirun's ``OMPI_COMM_WORLD_*`` variables are not a process group: a process launched by
mpirun binds alone, with its rank from those variables (``specbind.launcher``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

from specbind.core.errors import DistributedError

ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK")
T = TypeVar("T")


def launched(env: Mapping[str, str]) -> bool:
    """Whether torch.distributed's ``env://`` variables are all set (torchrun sets them)."""
    return all(env.get(k) for k in ENV_KEYS)


class Comm(Protocol):
    rank: int
    world: int
    backend: str  # the collectives' backend: "gloo", "nccl", or "local"

    def all_gather(self, obj: Any) -> list[Any]: ...

    def gather(self, obj: Any) -> list[Any] | None: ...  # on rank 0; None elsewhere

    def broadcast(self, obj: Any) -> Any: ...  # rank 0's object, on every rank

    def close(self) -> None: ...


class LocalComm:
    """A world of one rank: every collective is the identity."""

    rank = 0
    world = 1
    backend = "local"

    def all_gather(self, obj: Any) -> list[Any]:
        return [obj]

    def gather(self, obj: Any) -> list[Any] | None:
        return [obj]

    def broadcast(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass


def _line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"


class TorchComm:
    """This process's place in the torch.distributed process group torchrun set up."""

    def __init__(self, env: Mapping[str, str], timeout_s: float) -> None:
        try:
            import torch
            import torch.distributed as dist
        except ImportError as e:
            raise DistributedError(
                f"launched by torchrun, but torch does not import ({e}); install torch "
                "(the interop extra) or run without torchrun"
            ) from None
        self._dist = dist
        self.timeout_s = timeout_s
        from datetime import timedelta  # here: `bind` imports this module on every start

        where = f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
        cuda = torch.cuda.is_available()
        self.backend = "nccl" if cuda else "gloo"
        if cuda:
            torch.cuda.set_device(int(env.get("LOCAL_RANK", "0")))
        try:
            dist.init_process_group(self.backend, timeout=timedelta(seconds=timeout_s))
        except Exception as e:  # torch raises RuntimeError, DistStoreError, ValueError, ...
            raise DistributedError(
                f"could not join the other ranks at {where} within {timeout_s:g} s: {_line(e)}"
            ) from None
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except Exception as e:
            raise DistributedError(
                f"rank {self.rank} of {self.world} lost the other ranks during {what} "
                f"(one died, or none answered within {self.timeout_s:g} s): {_line(e)}"
            ) from None

    def all_gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world

        def run() -> list[Any]:
            self._dist.all_gather_object(out, obj)
            return out

        return self._call("an all-gather", run)

    def gather(self, obj: Any) -> list[Any] | None:
        out: list[Any] | None = [None] * self.world if self.rank == 0 else None

        def run() -> list[Any] | None:
            self._dist.gather_object(obj, out, dst=0)
            return out

        return self._call("a gather", run)

    def broadcast(self, obj: Any) -> Any:
        box = [obj]

        def run() -> Any:
            self._dist.broadcast_object_list(box, src=0)
            return box[0]

        return self._call("a broadcast", run)

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()
