"""torchrun runs of ``python -m specbind`` for the tests, with a bound on the work any may do:
shared by tests/runtime/test_distributed.py and the families' torchrun claims
(tests/families/test_family_llama.py).

Invariant: runs that together use more than ``BOUND`` seconds of CPU, or none for
``patience.STALL`` seconds (a hang), fail the test and are killed with every process under
them (torchrun and its workers: killing torchrun alone would orphan them). Not a wall-clock
deadline: on a loaded machine a healthy run takes longer, never more CPU
(tests/support/patience.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import patience
import pytest
import safetensors
from helpers import read_file

# CPU seconds the runs waited for together may use before the test calls them a loop. A healthy
# run uses 10-20 s (a 4-rank torchrun starts five Python processes that import torch), on a
# loaded machine as on an idle one.
BOUND = 240


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
    """Every run's (rc, stdout, stderr); fails the test if together they use more than BOUND
    seconds of CPU, or hang."""
    try:
        return patience.wait(*procs, cpu=BOUND)
    except patience.Stopped as e:
        for q in procs:  # a worker that left torchrun's tree is still in its process group
            with contextlib.suppress(ProcessLookupError):
                os.killpg(q.pid, signal.SIGKILL)
        pytest.fail(f"torchrun: {e}")


def load_dir(d: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, str]]:
    """The index of an --out-dir, each rank's tensors in rank order, and rank 0's metadata."""
    index = json.loads((d / "specbind-index.json").read_text())
    ranks = [read_file(d / r["file"]) for r in index["ranks"]]
    with safetensors.safe_open(str(d / index["ranks"][0]["file"]), framework="numpy") as f:
        meta = f.metadata()
    return index, ranks, meta
