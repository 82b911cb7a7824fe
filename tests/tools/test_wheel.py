"""The built wheel is a real package: everything under ``specbind``, data files included.

The wheel is built from this checkout and installed with pip into a fresh virtual environment
that has no access to the repository. Its dependencies (numpy, safetensors, ...) are borrowed from
the test environment through a ``.pth`` line, so the test runs offline and in seconds; the
editable install's import hook is not borrowed (a ``.pth`` path is not a site directory, so its
own ``.pth`` files are never run). Every command runs outside the repository, so nothing can be
imported from the checkout by accident. ruff, which only ``generate`` needs (the ``generate``
extra), is borrowed the same way, as installing ``specbind[generate]`` would provide it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import patience
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    patience.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(dist), str(REPO)],
        check=True, capture_output=True, text=True, cpu=300, cwd=root,
    )  # fmt: skip
    (wheel,) = dist.glob("specbind-*.whl")
    env_dir = root / "venv"
    patience.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True, cpu=120)
    site = Path(
        patience.run(
            [str(env_dir / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True, capture_output=True, text=True, cpu=60,
        ).stdout.strip()
    )  # fmt: skip
    (site / "_borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    patience.run(
        [sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
         "--quiet", "--no-deps", str(wheel)],
        check=True, capture_output=True, text=True, cpu=300, cwd=root,
    )  # fmt: skip
    return env_dir


def run(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    return patience.run(
        [str(venv / "bin" / args[0]), *args[1:]],
        capture_output=True, text=True, cpu=300, cwd=cwd, env=env,
    )  # fmt: skip


def test_the_wheel_installs_nothing_generic_at_the_top_of_site_packages(venv: Path) -> None:
    site = next((venv / "lib").glob("python3*/site-packages"))
    top = sorted(p.name for p in site.iterdir() if p.name != "_borrowed_deps.pth")
    assert top == ["specbind", "specbind-0.1.0.dist-info"]


def test_the_wheel_carries_specs_templates_and_kernel_sources(venv: Path) -> None:
    pkg = next((venv / "lib").glob("python3*/site-packages/specbind"))
    assert (pkg / "specs" / "models" / "glm-5.3-flash.yaml").is_file()
    assert (pkg / "specs" / "schema" / "block.schema.json").is_file()
    assert (pkg / "generator" / "templates" / "block.py.j2").is_file()
    assert (pkg / "generator" / "templates" / "fields" / "stack.py.j2").is_file()
    assert (pkg / "generated" / "kernels" / "specbind.cu").is_file()
    assert (pkg / "generated" / "kernels" / "__init__.py").is_file()
    assert (pkg / "py.typed").is_file()


def test_the_wheel_requires_ruff_only_through_the_generate_extra(venv: Path) -> None:
    (meta,) = (venv / "lib").glob("python3*/site-packages/specbind-0.1.0.dist-info/METADATA")
    requires = [
        line.removeprefix("Requires-Dist: ")
        for line in meta.read_text().splitlines()
        if line.startswith("Requires-Dist: ")
    ]
    assert [r for r in requires if r.startswith("ruff")] == ['ruff==0.17.6; extra == "generate"']
    assert 'specbind[generate]; extra == "test"' in requires
    assert "Provides-Extra: generate" in meta.read_text().splitlines()


def test_installed_specbind_checks_its_generated_code_against_its_specs(
    venv: Path, tmp_path: Path
) -> None:
    proc = run(venv, tmp_path, "specbind", "generate", "--check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "generated/ is up to date"


def test_installed_specbind_synthesises_and_binds_a_tiny_checkpoint(
    venv: Path, tmp_path: Path
) -> None:
    assert run(venv, tmp_path, "specbind", "synth", "ck", "--seed", "1").returncode == 0
    proc = run(venv, tmp_path, "specbind", "bind", "ck", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    audit = json.loads(run(venv, tmp_path, "specbind", "audit", "ck", "--json").stdout)
    seen = sum(s["seen"] for layer in report["layers"] for s in layer["slots"].values())
    assert len(report["layers"]) == 9 and report["globals"]["bound"] == 3
    assert seen + report["globals"]["bound"] == audit["tensors"], "every tensor is bound"


def test_import_specbind_finds_the_installed_copy_and_no_bare_runtime(
    venv: Path, tmp_path: Path
) -> None:
    code = (
        "import importlib.util, specbind, specbind.runtime.bind.bind\n"
        "print(specbind.__file__)\n"
        "print([n for n in ('runtime', 'generated', 'generator', 'core')"
        " if importlib.util.find_spec(n) is not None])\n"
    )
    proc = run(venv, tmp_path, "python", "-c", code)
    assert proc.returncode == 0, proc.stderr
    where, bare = proc.stdout.splitlines()
    assert where.startswith(str(venv)) and "site-packages" in where
    assert bare == "[]"


def test_the_wheel_holds_no_benchmark_baselines_or_lab_modules(venv: Path) -> None:
    """The benchmark suite (``benchmarks/``: hand-written competitor loaders, one-investigation
    rows, GPU checks) runs from a clone; the wheel carries only ``specbind/bench.py``, the
    measurement ``specbind bench`` runs on a user's checkpoint."""
    pkg = next((venv / "lib").glob("python3*/site-packages/specbind"))
    shipped = sorted(str(p.relative_to(pkg)) for p in pkg.rglob("*.py"))
    assert [f for f in shipped if "bench" in f or "baseline" in f] == ["bench.py"]
    lab = {p.read_bytes() for p in (REPO / "benchmarks").rglob("*.py")}
    assert len(lab) > 10
    assert [f for f in shipped if (pkg / f).read_bytes() in lab] == []


def test_installed_specbind_bench_times_a_bind_beside_safetensors_slicing(
    venv: Path, tmp_path: Path
) -> None:
    assert run(venv, tmp_path, "specbind", "synth", "ck", "--seed", "1").returncode == 0
    proc = run(venv, tmp_path, "specbind", "bench", "ck", "--repeat", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout)
    assert r["share_bytes"] > 0
    assert all(r[side]["seconds"] > 0 for side in ("specbind", "safetensors"))
