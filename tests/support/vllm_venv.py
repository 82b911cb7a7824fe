"""Where the vLLM venv is (.ci/vllm-venv builds it), and why a test skips without it.

The path is the script's: ``$XDG_CACHE_HOME/specbind/vllm-venv-<first 12 hex of the SHA-256
of .ci/vllm-pins.txt>``, counted as built once ``.built`` exists. specbind is installed in
it editable (for the ``vllm.general_plugins`` entry point that registers
``load_format="specbind"``), but a scenario runs with ``PYTHONPATH`` set to this clone, so the
code vLLM and its workers import is this clone's whichever clone installed it: two clones (or
worktrees) can run the vLLM tests at once.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path
from typing import IO

import patience

REPO = Path(__file__).resolve().parents[2]


def venv_dir() -> Path:
    key = hashlib.sha256((REPO / ".ci" / "vllm-pins.txt").read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "specbind" / f"vllm-venv-{key}"


def why_missing() -> str | None:
    """None when the venv is built and holds specbind's entry point, else the reason."""
    v = venv_dir()
    if not (v / ".built").exists():
        return f"the vLLM venv {v} is not built (`make vllm-venv`; its log: {v}.log)"
    if not (v / ".specbind").exists():
        return f"the vLLM venv {v} has no specbind installed; run .ci/vllm-venv"
    return None


def python() -> Path:
    return venv_dir() / "bin" / "python"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PYTHONPATH"] = str(REPO)  # this clone's specbind, not the one installed editable
    return env


def run_scenario(spec: Path, out: Path, cpu: float) -> subprocess.CompletedProcess[str]:
    """``tests/support/vllm_scenario.py`` in the vLLM venv; stdout and stderr captured. Bounded
    by ``cpu`` seconds of CPU (its engines' processes included) and by a hang, never by the
    clock (tests/support/patience.py): a loaded machine gives a slow run, not a timeout."""
    return patience.run(
        [str(python()), str(REPO / "tests" / "support" / "vllm_scenario.py"), str(spec), str(out)],
        capture_output=True, text=True, cpu=cpu, env=_env(), cwd=spec.parent, check=False,
    )  # fmt: skip


def popen(argv: list[str], cwd: Path, log: IO[str]) -> subprocess.Popen[str]:
    """The vLLM venv's python on ``argv``, started (stdout and stderr to ``log``: a file, not a
    pipe, so that a worker never blocks on a full pipe its peer's reader is not draining), with
    one OpenMP thread: the proofs' workers run one per core."""
    env = _env() | {"OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [str(python()), *argv], stdout=log, stderr=subprocess.STDOUT, text=True, env=env,
        cwd=cwd,
    )  # fmt: skip
