"""``make gpu-wheels`` and ``make gpu-check`` without a GPU: the wheel set's closure over the
image, the check's time limits and report, its kernel step against the stand-in CuPy (whose
kernels run on the CPU harness), and the MXFP4 dequant the CuPy backend lacked."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import patience
from packaging.version import Version

from benchmarks import gpu_check, gpu_families, gpu_kernels, gpu_wheels

SUPPORT = Path(__file__).resolve().parents[1] / "support"  # fake_cupy


def wheel(folder: Path, name: str, version: str, requires: list[str] = (),  # type: ignore[assignment]
          tag: str = "py3-none-any", python: str = ">=3.9") -> Path:  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name.replace('-', '_')}-{version}-{tag}.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
            f"Requires-Python: {python}", *[f"Requires-Dist: {r}" for r in requires]]  # fmt: skip
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name.replace('-', '_')}-{version}.dist-info/METADATA", "\n".join(meta) + "\n")
    return path


def pinned_wheels(folder: Path) -> dict[str, Version]:
    pins = gpu_wheels.read_pins()
    for name, v in pins.items():
        wheel(folder, name, str(v))
    return pins


def test_the_pinned_wheels_with_the_image_cover_specbinds_requirements(tmp_path: Path) -> None:
    r = gpu_wheels.check(tmp_path / "w")
    assert r["problems"][0].endswith("no such folder (make gpu-wheels downloads it)")
    pinned_wheels(tmp_path / "w")
    r = gpu_wheels.check(tmp_path / "w")
    assert r["ok"], r["problems"]
    assert {"jsonschema", "google-re2", "referencing", "rpds-py"} <= set(gpu_wheels.read_pins())


def test_a_wheel_needing_what_neither_the_image_nor_a_wheel_holds_is_refused_naming_both(
    tmp_path: Path,
) -> None:
    pins = pinned_wheels(tmp_path / "w")
    (tmp_path / "w" / "jsonschema-4.26.0-py3-none-any.whl").unlink()
    wheel(tmp_path / "w", "jsonschema", "4.26.0", ["attrs>=22.2.0", "fqdn>=1", "numpy>=3"])
    r = gpu_wheels.check(tmp_path / "w", pins=pins)
    assert r["problems"] == [
        "jsonschema-4.26.0-py3-none-any.whl requires fqdn>=1: neither the image nor a wheel holds it",
        "jsonschema-4.26.0-py3-none-any.whl requires numpy>=3: 2.5 is there",
    ]


def test_a_requirement_for_another_python_or_an_extra_is_not_needed(tmp_path: Path) -> None:
    pins = pinned_wheels(tmp_path / "w")
    (tmp_path / "w" / "referencing-0.37.0-py3-none-any.whl").unlink()
    wheel(tmp_path / "w", "referencing", "0.37.0", ["fqdn; extra == 'format'",
          "tomli; python_version < '3.11'", "exceptiongroup; python_version >= '3.13'"])  # fmt: skip
    assert gpu_wheels.check(tmp_path / "w", pins=pins)["ok"]


def test_wheels_that_cannot_install_on_cpython_312_or_clash_are_refused(tmp_path: Path) -> None:
    pins = pinned_wheels(tmp_path / "w")
    (tmp_path / "w" / "rpds_py-2026.9.1-py3-none-any.whl").unlink()
    wheel(tmp_path / "w", "rpds-py", "2026.9.1", tag="cp311-cp311-manylinux_2_17_x86_64")
    wheel(tmp_path / "w", "attrs", "25.0.0")
    wheel(tmp_path / "w", "numpy", "2.5.0", python=">=3.13")
    r = gpu_wheels.check(tmp_path / "w", pins=pins, limit=1000)
    assert (
        "attrs-26.1.0-py3-none-any.whl: a second wheel of attrs (beside attrs-25.0.0-py3-none-any.whl)"
        in r["problems"]
    )
    assert (
        "numpy-2.5.0-py3-none-any.whl: Requires-Python >=3.13 excludes Python 3.12.3"
        in r["problems"]
    )
    assert (
        "numpy-2.5.0-py3-none-any.whl: the image already holds numpy; the wheel would shadow it"
        in r["problems"]
    )
    assert (
        "rpds_py-2026.9.1-cp311-cp311-manylinux_2_17_x86_64.whl: its tags do not install on CPython 3.12 manylinux x86_64"
        in r["problems"]
    )
    assert r["problems"][-1].endswith("bytes of wheels, over the 1000-byte limit")


def test_a_step_that_overruns_is_killed_with_its_children_and_reported_as_a_timeout(
    tmp_path: Path,
) -> None:
    pid = tmp_path / "pid"
    # The child would sleep 600 s: a check that ends well before that killed it. The bounds
    # leave a loaded machine (load 19 on 2 cores) a hundred times the idle second or two.
    script = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '600']); "
              f"open({str(pid)!r}, 'w').write(str(p.pid)); time.sleep(600)")  # fmt: skip
    t0 = time.monotonic()
    r = gpu_check.check(tmp_path / "out", tmp_path / "nowheels", budget=600, small=True,
                        steps=(("slow", 1.5),),
                        child=[sys.executable, "-c", script])  # fmt: skip
    assert time.monotonic() - t0 < 300
    assert r["steps"]["slow"]["status"] == "timeout"
    assert 1.5 <= r["steps"]["slow"]["seconds"] < 300
    assert patience.killed(int(pid.read_text()))  # gone, or SIGKILLed: no wait, whatever the load
    assert r["ok"] is False
    assert (
        json.loads((tmp_path / "out" / "gpu-check.json").read_text())["steps"]["slow"]["status"]
        == "timeout"
    )


def test_a_step_whose_turn_comes_after_the_budget_is_skipped_not_run_short(tmp_path: Path) -> None:
    r = gpu_check.check(tmp_path / "out", tmp_path / "nowheels", budget=6.0, small=True,
                        steps=(("first", 2.0), ("second", 30.0)),
                        child=[sys.executable, "-c", "import time; time.sleep(60)"])  # fmt: skip
    assert r["steps"]["first"]["status"] == "timeout"
    assert r["steps"]["second"]["status"] == "skipped"
    assert r["steps"]["second"]["why"].endswith("s of the budget left")
    assert r["seconds"] < 6.0 and r["ok"] is False


def test_the_kernel_step_runs_every_kernel_against_the_harness_and_reports_in_one_file(
    tmp_path: Path, monkeypatch: Any
) -> None:
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "cupy.py").write_text(
        f"import sys\nsys.path.insert(0, {str(SUPPORT)!r})\nimport fake_cupy\n"
        f"sys.modules[__name__] = fake_cupy.make({str(tmp_path)!r})\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(shim), os.environ.get("PYTHONPATH", "")]))
    r = gpu_check.check(tmp_path / "out", tmp_path / "nowheels", budget=120, small=True,
                        steps=(("kernels", 100.0),))  # fmt: skip
    step = r["steps"]["kernels"]
    assert step["status"] == "passed", step["output_tail"]
    res = step["result"]
    assert res["kernels"] == len(gpu_kernels.kernel_names()) >= 10
    assert {row["kernel"] for row in res["rows"]} == set(gpu_kernels.kernel_names())
    assert all(row["equal"] and row["mismatches"] == 0 for row in res["rows"])
    assert r["wheels"]["ok"] and r["ok"]
    on_disk = tmp_path / "out" / "gpu-check.json"
    assert json.loads(on_disk.read_text())["steps"]["kernels"]["result"]["cases"] == res["cases"]
    assert on_disk.stat().st_size < 16 << 20


def test_a_kernel_whose_output_differs_in_one_bit_is_reported_with_its_first_index(
    fake_cupy: Any, tmp_path: Path
) -> None:
    k = importlib.import_module("specbind.generated.kernels")
    host = gpu_kernels.host_kernels(tmp_path / "h")

    class OneBitOff:
        def __getattr__(self, name: str) -> Any:
            return getattr(k, name)

        def narrow_f32_bf16(self, x: Any) -> Any:
            out = k.narrow_f32_bf16(x)
            if out.size > 300:
                out[300] ^= 1
            return out

    r = gpu_kernels.run(OneBitOff(), host, fake_cupy, scale=1)
    bad = [row for row in r["rows"] if not row["equal"]]
    assert r["ok"] is False and bad and all(row["kernel"] == "narrow_f32_bf16" for row in bad)
    assert bad[0]["first_index"] == 300 and bad[0]["mismatches"] == 1
    assert bad[0]["got"] ^ bad[0]["want"] == 1


def test_the_cupy_backend_binds_an_mxfp4_family_as_the_numpy_backend_does(
    fake_cupy: Any, tmp_path: Path
) -> None:
    from specbind.generated import MODELS

    def experts(t: Any) -> bool:  # MXFP4 quantizes expert families: a dense model binds none
        return any(
            r.family is not None or r.stacked is not None for b in t.blocks for r in b.tensors
        )

    mx = [n for n, t in MODELS.items() if any(s.name == "mxfp4" for s in t.schemes) and experts(t)]
    mx = mx[:1]
    r = gpu_families.families(tmp_path, models=mx)
    rows = [row for row in r["rows"] if row["scheme"] == "mxfp4"]
    assert r["ok"], [row["problems"] for row in r["rows"] if not row["equal"]]
    assert rows and any(row["fields"] for row in rows)
