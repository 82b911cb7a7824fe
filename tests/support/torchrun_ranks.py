"""torchrun runs of ``python -m specbind`` for the tests, with a bound on how long any may
take: shared by tests/runtime/test_distributed.py and the families' torchrun claims
(tests/families/test_family_llama.py).

Invariant: a run that outlives ``BOUND`` seconds fails the test and is killed with its whole
process group (torchrun and its workers: killing torchrun alone would orphan them).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import safetensors
from helpers import read_file

# Seconds any run may take before the test calls it a hang. A hang never ends; a healthy run
# takes 10-20 s alone and several times that on a loaded 2-core machine (a 4-rank torchrun
# starts five Python processes that import torch), so the bound leaves room for load.
BOUND = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def torchrun(
    nproc: int, *args: str, node: tuple[int, int, int] | None = None
) -> subprocess.Popen[str]:
    """Start ``torchrun -m specbind ARGS``; ``node`` = (nnodes, node_rank, master_port)."""
    if node is None:
        launch = ["--standalone"]
    else:
        nnodes, rank, port = node
        launch = [
            f"--nnodes={nnodes}", f"--node-rank={rank}", "--master-addr=127.0.0.1",
            f"--master-port={port}",
        ]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *launch, f"--nproc-per-node={nproc}",
         "-m", "specbind", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,  # its own process group: a hang is ended with its workers
    )  # fmt: skip


def finish(*procs: subprocess.Popen[str]) -> list[tuple[int, str, str]]:
    """Every run's (rc, stdout, stderr); fails the test if any outlives BOUND seconds."""
    out = []
    deadline = time.monotonic() + BOUND
    for p in procs:
        try:
            so, se = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:  # torchrun and its workers: killing torchrun alone orphans them
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(q.pid, signal.SIGKILL)
                q.wait()
            pytest.fail(f"a torchrun run outlived {BOUND} s: nothing may hang")
        out.append((p.returncode, so, se))
    return out


def load_dir(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """The index of an --out-dir, each rank's tensors in rank order, and rank 0's metadata."""
    index = json.loads((d / "specbind-index.json").read_text())
    ranks = [read_file(d / r["file"]) for r in index["ranks"]]
    with safetensors.safe_open(str(d / index["ranks"][0]["file"]), framework="numpy") as f:
        meta = f.metadata()
    return index, ranks, meta
