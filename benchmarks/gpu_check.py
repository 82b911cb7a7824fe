"""``make gpu-check``: one offline check of a bare GPU machine, each step with its own
timeout, the whole inside ``--budget`` seconds, one JSON report in the folder the caller names.

Run from a checkout: ``python3 -m benchmarks.gpu_check --out DIR``. With no package index:
the wheels in ``--wheels`` (``make gpu-wheels``) are checked (``gpu_wheels.check``) and
installed with ``pip install --no-index --no-deps --target``; every step then runs in a child
process whose PYTHONPATH is that target and the checkout. The steps (``STEPS``):

1. ``kernels``: every generated kernel against the CPU harness, bit for bit (``gpu_kernels``);
2. ``families``: each family's CuPy bind equal to its NumPy bind (``gpu_families``);
3. ``torch``: ``backend="torch", device="cuda"`` through DLPack, no host copy;
4. ``bandwidth``: kernels against a device-to-device copy, a rank bind on the GPU against the
   host bind, host-to-device with pinned staging against the link (``bench.gpu``);
5. ``tests_gpu``: ``pytest tests/gpu``.
Invariants: a step that overruns is killed with its whole process group and reported as
``timeout``; a step whose turn comes with under ``MIN_STEP_S`` of the budget left is reported
``skipped``, never run short; the report is written (atomically) whatever happens, and the exit
status is 0 only when every step passed and every target was met. ``--small`` runs each step
at small sizes (for a machine without a GPU, with a stand-in CuPy: the suite's check).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import gpu_wheels

REPO = Path(__file__).resolve().parents[1]
REPORT = "gpu-check.json"
REPORT_LIMIT = 16 << 20
BUDGET_S = 360.0  # twice in 15 minutes, with a machine's start between
MIN_STEP_S = 5.0
# (step, its timeout in seconds)
STEPS: tuple[tuple[str, float], ...] = (
    ("kernels", 45.0), ("families", 120.0), ("torch", 45.0), ("bandwidth", 75.0),
    ("tests_gpu", 60.0),
)  # fmt: skip
TARGETS = {"kernel_over_copy": 0.8, "staged_over_link": 0.8}


def environment() -> dict[str, Any]:
    """Versions and the device, as the child sees them."""
    import numpy as np

    from specbind.generated import kernels as k

    cp = k.cupy()
    env: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__,
                           "cupy": getattr(cp, "__version__", "stand-in")}  # fmt: skip
    try:
        props = cp.cuda.runtime.getDeviceProperties(0)
        env["device"] = (
            props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        )
    except Exception as e:  # the stand-in has no properties
        env["device"] = f"unknown ({type(e).__name__})"
    return env


def step(name: str, scratch: Path, small: bool) -> dict[str, Any]:
    """Run step ``name`` here (in the child) and return its result."""
    from benchmarks import gpu_families, gpu_kernels
    from specbind.generated import kernels as k
    from specbind.runtime.binder import backends

    backends.cupy_backend(k)  # a clear error when CuPy or a device is missing
    if name == "kernels":
        host = gpu_kernels.host_kernels(scratch / "harness")
        return gpu_kernels.run(k, host, k.cupy(), scale=1 if small else 16)
    if name == "families":
        return gpu_families.families(scratch / "families")
    if name == "torch":
        return gpu_families.torch_handoff(scratch / "families")
    if name == "bandwidth":
        return bandwidth(scratch, small)
    if name == "tests_gpu":
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
               str(REPO / "tests" / "gpu")]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
        return {"ok": proc.returncode == 0, "exit": proc.returncode,
                "tail": proc.stdout[-3000:]}  # fmt: skip
    raise SystemExit(f"gpu-check: unknown step {name!r}")


def bandwidth(scratch: Path, small: bool) -> dict[str, Any]:
    from benchmarks import gpu
    from benchmarks.main import DEFAULT_SETS, slice_layers, slice_values
    from specbind import api
    from specbind.runtime.io.checkpoint import CheckpointDir
    from specbind.synth import synth

    kernels = gpu.run(1 << 16 if small else 64 << 20)
    table = api.model_table(None)
    ck = scratch / "slice"
    if not (ck / "config.json").exists():
        values = slice_values(table, small, {} if small else DEFAULT_SETS)
        synth(table, ck, values, layers=slice_layers(table), mtp=False, sparse=True)
    bind = gpu.rank_bind(CheckpointDir(ck), table, tp=8, rank=0)
    fields = bind.pop("fields")
    from specbind.generated import kernels as k

    moves = gpu.transfers(k.cupy(), fields, link_bytes=1 << 20 if small else 256 << 20)
    worst = min(r["kernel_over_copy"] for r in kernels)
    return {
        "ok": moves["staged_bytes_equal"],
        "kernels": kernels,
        "rank_bind": bind,
        "host_to_device": moves,
        "targets": {
            "kernel_over_copy": {"worst": worst, "met": worst >= TARGETS["kernel_over_copy"]},
            "staged_over_link": {
                "value": moves["staged_over_link"],
                "met": moves["staged_over_link"] >= TARGETS["staged_over_link"],
            },
        },
    }


def install(wheels: Path, site: Path) -> dict[str, Any]:
    """The wheels checked, then installed into ``site`` with no index (nothing when the folder
    is absent and every requirement already imports: a developer's venv)."""
    closure = gpu_wheels.check(wheels)
    if not wheels.is_dir():
        from importlib.metadata import PackageNotFoundError, version

        missing = []
        for name in gpu_wheels.read_pins():
            try:
                version(name)
            except PackageNotFoundError:
                missing.append(name)
        why = f"{wheels}: no wheel folder; " + (
            f"this interpreter lacks {missing}" if missing else "this interpreter holds them all"
        )
        return {"ok": not missing, "installed": False, "problems": [why]}
    if not closure["ok"]:
        return closure | {"installed": False}
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
           "--no-compile", "--no-cache-dir", "--upgrade", "--target", str(site),
           *[str(w) for w in sorted(wheels.glob("*.whl"))]]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    ok = proc.returncode == 0
    return closure | {"ok": ok, "installed": ok, "pip_tail": proc.stderr[-2000:]}


def run_child(argv: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """One step in its own process group; killed whole at ``timeout``."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        t0 = time.monotonic()
        proc = subprocess.Popen([*argv, "--result", str(result)], env=env, cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=timeout)
            status = None
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            status = "timeout"
        row: dict[str, Any] = {"seconds": round(time.monotonic() - t0, 2),
                               "timeout_s": round(timeout, 1)}  # fmt: skip
        if status is None and result.exists():
            res = json.loads(result.read_text())
            row |= {"status": "passed" if res.get("ok") else "failed", "result": res}
        else:
            row["status"] = status or f"error (exit {proc.returncode})"
        row["output_tail"] = (out or "")[-2000:]
        return row


def check(out: Path, wheels: Path, budget: float, small: bool,
          steps: tuple[tuple[str, float], ...] = STEPS,
          child: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """Every step inside ``budget`` seconds; the report (also written to ``out/REPORT``)."""
    t0 = time.monotonic()
    report: dict[str, Any] = {"ok": False, "budget_s": budget, "steps": {}}
    with tempfile.TemporaryDirectory(prefix="specbind-gpu-check-") as tmp:
        scratch = Path(tmp)
        report["wheels"] = install(wheels, scratch / "site")
        paths = [str(scratch / "site"), str(REPO), os.environ.get("PYTHONPATH", "")]
        env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in paths if p),
                            "PYTHONUNBUFFERED": "1"}  # fmt: skip
        for name, limit in steps:
            left = budget - (time.monotonic() - t0)
            if left < MIN_STEP_S:
                report["steps"][name] = {
                    "status": "skipped",
                    "why": f"{left:.0f} s of the budget left",
                }
                continue
            argv = child or [sys.executable, "-m", "benchmarks.gpu_check"]
            argv = [*argv, "--step", name, "--scratch", str(scratch)] + (["--small"] * small)
            report["steps"][name] = run_child(argv, env, min(limit, left))
    report["seconds"] = round(time.monotonic() - t0, 2)
    passed = [s.get("status") == "passed" for s in report["steps"].values()]
    envs = [s["result"].get("env") for s in report["steps"].values() if "result" in s]
    report["machine"] = next((e for e in envs if e), None)
    met = [t["met"] for s in report["steps"].values() if "result" in s
           for t in s["result"].get("targets", {}).values()]  # fmt: skip
    report["targets_met"] = all(met)
    report["ok"] = bool(report["wheels"]["ok"] and all(passed) and all(met)
                        and report["seconds"] <= budget)  # fmt: skip
    write(out, report)
    return report


def write(out: Path, report: dict[str, Any]) -> None:
    """The report as one JSON file under ``REPORT_LIMIT`` bytes (per-case rows dropped first)."""
    text = json.dumps(report, indent=1, default=str)
    if len(text) > REPORT_LIMIT:
        for s in report["steps"].values():
            s.get("result", {}).pop("rows", None)
        text = json.dumps(report, default=str)[:REPORT_LIMIT]
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{REPORT}.tmp"
    tmp.write_text(text)
    tmp.replace(out / REPORT)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check")
    p.add_argument("--out", type=Path, help="the folder the report is written to")
    p.add_argument("--wheels", type=Path, default=gpu_wheels.DEFAULT_DIR)
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for the whole check")
    p.add_argument("--small", action="store_true", help="small sizes (no GPU, stand-in CuPy)")
    p.add_argument("--step", help=argparse.SUPPRESS)
    p.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.step:  # a child: one step, its result to --result
        res = step(a.step, a.scratch, a.small)
        res["env"] = environment()
        a.result.write_text(json.dumps(res, default=str))
        return 0
    if a.out is None:
        p.error("--out DIR is required")
    r = check(a.out, a.wheels, a.budget, a.small)
    for name, s in r["steps"].items():
        print(f"gpu-check: {name}: {s['status']} ({s.get('seconds', 0)} s)")
    verdict = "OK" if r["ok"] else "FAILED"
    print(f"gpu-check: {verdict} in {r['seconds']} s; report {a.out / REPORT}")
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
