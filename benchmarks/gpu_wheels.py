"""The wheels a bare GPU image lacks (``make gpu-wheels``), and the proof that they close.

``.ci/gpu-image.txt`` lists what the image holds, ``.ci/gpu-wheels.txt`` pins (with hashes)
what it lacks. ``download`` fetches exactly those files for CPython 3.12 manylinux x86_64;
``check`` reads the wheels themselves (file names and METADATA, nothing installed) and refuses,
one line each, naming the wheel and the requirement:
- a wheel that cannot install on CPython 3.12 manylinux x86_64 (its tags, its Requires-Python);
- two wheels of one name (``pip install --no-deps`` of both fails), a pin with no wheel, a
  wheel for a package the image already holds (it would shadow the image's);
- a requirement, of a wheel or of specbind (pyproject's dependencies, and what the check
  itself imports: ``CHECK_NEEDS``), that neither another wheel nor the image satisfies, markers
  evaluated for that interpreter with no extra;
- a folder over ``LIMIT`` bytes.
Trap: where the image list gives no version, only the name is checked; ``X.Y`` stands for
``X.Y.0``. The list says what the image holds as the issue tells it, not what pip would find.
"""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from typing import Any

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
IMAGE = REPO / ".ci" / "gpu-image.txt"
PINS = REPO / ".ci" / "gpu-wheels.txt"
DEFAULT_DIR = REPO / ".gpu-wheels"
LIMIT = 20 << 20
PYTHON = "3.12.3"
PLATFORMS = ["manylinux2014_x86_64"] + [f"manylinux_2_{n}_x86_64" for n in range(39, 4, -1)]
# What the check imports beyond specbind's own dependencies (the gpu extra, the torch hand-off,
# the tests/gpu run).
CHECK_NEEDS = ("cupy-cuda13x>=14", "torch", "pytest", "hypothesis")
DOWNLOAD_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                      "manylinux2014_x86_64")  # fmt: skip


def read_image(path: Path = IMAGE) -> dict[str, Version | None]:
    """``name [version]`` per line, ``#`` comments: name (canonical) -> version or None."""
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            out[canonicalize_name(words[0])] = Version(words[1]) if len(words) > 1 else None
    return out


def read_pins(path: Path = PINS) -> dict[str, Version]:
    """``name==version --hash=...`` per line: name (canonical) -> version."""
    out: dict[str, Version] = {}
    for line in path.read_text().splitlines():
        spec = line.split("#", 1)[0].split(" --hash", 1)[0].strip()
        if spec:
            name, _, version = spec.partition("==")
            out[canonicalize_name(name)] = Version(version)
    return out


def environment() -> dict[str, str]:
    """The marker environment of the image's interpreter (CPython 3.12 on Linux x86_64)."""
    env = {k: str(v) for k, v in default_environment().items()}
    env |= {"python_version": PYTHON.rsplit(".", 1)[0], "python_full_version": PYTHON,
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "platform_machine": "x86_64", "implementation_version": PYTHON,
            "extra": ""}  # fmt: skip
    return env


def supported_tags() -> set[Tag]:
    py = tuple(int(x) for x in PYTHON.split(".")[:2])
    tags = set(cpython_tags(py, platforms=PLATFORMS))
    return tags | set(compatible_tags(py, "cp312", platforms=PLATFORMS))


def metadata(wheel: Path) -> Any:
    """The wheel's METADATA (``email.message.Message``), read from the zip."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise ValueError(f"{len(names)} .dist-info/METADATA files")
        return email.parser.Parser().parsestr(z.read(names[0]).decode())


def unmet(req: Requirement, have: dict[str, Version | None]) -> str | None:
    """Why ``req`` is not met by ``have`` (name -> version or None: any), or None."""
    if req.marker is not None and not req.marker.evaluate(environment()):
        return None
    name = canonicalize_name(req.name)
    if name not in have:
        return "neither the image nor a wheel holds it"
    got = have[name]
    if got is not None and req.specifier and not req.specifier.contains(got, prereleases=True):
        return f"{got} is there"
    return None


def specbind_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in (*project["dependencies"], *CHECK_NEEDS)]


def check(
    folder: Path,
    image: dict[str, Version | None] | None = None,
    pins: dict[str, Version] | None = None,
    limit: int = LIMIT,
) -> dict[str, Any]:
    """The closure of ``folder``'s wheels over the image: problems (one line each) and a tally."""
    image = read_image() if image is None else image
    pins = read_pins() if pins is None else pins
    problems: list[str] = []
    wheels: dict[str, tuple[Path, Version]] = {}
    files = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not folder.is_dir():
        problems.append(f"{folder}: no such folder (make gpu-wheels downloads it)")
    tags = supported_tags()
    metas: dict[str, Any] = {}
    for w in files:
        try:
            name, version, _, wtags = parse_wheel_filename(w.name)
            meta = metadata(w)
        except (ValueError, zipfile.BadZipFile) as e:
            problems.append(f"{w.name}: not a readable wheel: {e}")
            continue
        if name in wheels:
            problems.append(f"{w.name}: a second wheel of {name} (beside {wheels[name][0].name})")
            continue
        wheels[name] = (w, version)
        metas[name] = meta
        if not wtags & tags:
            problems.append(f"{w.name}: its tags do not install on CPython 3.12 manylinux x86_64")
        rp = meta.get("Requires-Python")
        if rp and not Requirement(f"python{rp}").specifier.contains(PYTHON):
            problems.append(f"{w.name}: Requires-Python {rp} excludes Python {PYTHON}")
        if name in image:
            problems.append(f"{w.name}: the image already holds {name}; the wheel would shadow it")
        if name not in pins:
            problems.append(f"{w.name}: not pinned in {PINS.name}")
        elif pins[name] != version:
            problems.append(f"{w.name}: {PINS.name} pins {name}=={pins[name]}")
    for pin in sorted(set(pins) - set(wheels)):
        problems.append(f"{pin}=={pins[pin]}: pinned in {PINS.name} but no wheel in {folder}")
    have: dict[str, Version | None] = image | {n: v for n, (_, v) in wheels.items()}
    for whl, meta in metas.items():
        for line in meta.get_all("Requires-Dist") or []:
            why = unmet(Requirement(line), have)
            if why:
                problems.append(f"{wheels[whl][0].name} requires {line}: {why}")
    for req in specbind_requirements():
        why = unmet(req, have)
        if why:
            problems.append(f"specbind requires {req}: {why}")
    size = sum(w.stat().st_size for w in files)
    if size > limit:
        problems.append(f"{folder}: {size} bytes of wheels, over the {limit}-byte limit")
    return {"ok": not problems, "problems": problems, "wheels": [w.name for w in files],
            "bytes": size}  # fmt: skip


def download(folder: Path) -> None:
    """Exactly the pinned files (their hashes checked by pip) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--require-hashes",
           *[a for p in DOWNLOAD_PLATFORMS for a in ("--platform", p)], "-d", str(folder),
           "-r", str(PINS)]  # fmt: skip
    subprocess.run(cmd, check=True)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("download", "check"):
        print("usage: python -m benchmarks.gpu_wheels download|check [DIR]", file=sys.stderr)
        return 2
    folder = Path(argv[1]) if len(argv) > 1 else DEFAULT_DIR
    if argv[0] == "download":
        download(folder)
    r = check(folder)
    for p in r["problems"]:
        print(f"gpu-wheels: {p}", file=sys.stderr)
    if r["ok"]:
        print(f"gpu-wheels: {len(r['wheels'])} wheels, {r['bytes']} bytes in {folder}; with "
              f"{IMAGE.name} they close over specbind's requirements and their own")  # fmt: skip
    return 0 if r["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
