"""Run the array API conformance suite (data-apis/array-api-tests) against laneflow.

    python tools/array_api_suite.py [--suite DIR] [--device cpu|gpu] [--version 2024.12] [--max-examples 50]
                                    [--seed 0] [-- pytest args, e.g. array_api_tests/test_linalg.py]

The suite is copied to a temporary folder (``--suite DIR``, ``$ARRAY_API_TESTS_DIR``, the team's
``../shared/array-api-tests`` beside the checkout, or a git-ignored ``.array-api-tests`` inside it; without
any it is cloned from GitHub at ``$ARRAY_API_TESTS_REF``, default ``master``), and run there with
``ARRAY_API_TESTS_MODULE=laneflow``, ``ARRAY_API_TESTS_VERSION`` (``--version``, default the version laneflow
declares, ``lf.__array_api_version__``), a fixed Hypothesis seed and ``--max-examples``; the ``fft``
extension, which laneflow does not have, is disabled (the ``linalg`` one runs). ``--device gpu`` (or
``$LANEFLOW_DEVICE``) makes that device the default for every array the suite creates, through a small
pytest plugin written next to the copy.

Known failures are listed, each with its reason, in ``tests/array_api_xfails.txt``
(``<test id>  # reason``); any other failure fails the run (exit status 1). The file's entries must
all match collected tests, so a fixed entry cannot linger.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
XFAILS = ROOT / "tests" / "array_api_xfails.txt"
REPO = "https://github.com/data-apis/array-api-tests"

PLUGIN = '''\
"""Written by laneflow's tools/array_api_suite.py: the default device for the whole run, and a skip
for the names of the disabled fft extension."""
import os

import pytest

import laneflow

laneflow.set_default_device(laneflow.Device(os.environ.get("LANEFLOW_DEVICE", "cpu")))


def pytest_collection_modifyitems(config, items):
    fft = pytest.mark.skip(reason="the fft extension is disabled: laneflow has none (test_has_names ignores "
                                  "--disable-extension)")
    for item in items:
        if "test_has_names[fft-" in item.nodeid:
            item.add_marker(fft)
'''


def read_xfails(path: Path) -> list[str]:
    """The test ids of the xfails file; every entry must give its reason after a ``#``."""
    ids = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        test, _, reason = line.partition("  # ")
        if not reason.strip():
            sys.exit(f"{path}:{n}: an xfail without its reason ('<test id>  # why'): {line}")
        ids.append(test.strip())
    return ids


def suite_copy(src: str | None, into: Path) -> Path:
    dest = into / "array-api-tests"
    if src:
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns(".git", "__pycache__", ".hypothesis"))
    else:
        ref = os.environ.get("ARRAY_API_TESTS_REF", "master")
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", ref, "--recurse-submodules",
                        "--shallow-submodules", REPO, str(dest)], check=True)
    return dest


def _beside() -> str | None:
    """A copy of the suite next to the checkout (the team's shared folder) or inside it (git-ignored, e.g.
    carried to a GPU machine without network)."""
    for cand in (ROOT.parent / "shared" / "array-api-tests", ROOT / ".array-api-tests"):
        if (cand / "array_api_tests").is_dir():
            return str(cand)
    return None


def declared_version() -> str:
    """The standard version laneflow declares (``__array_api_version__``), read from its source so the
    runner does not import laneflow (and its backends) itself."""
    text = (ROOT / "src" / "laneflow" / "_array_api.py").read_text()
    m = re.search(r"^API_VERSIONS[^=]*= \(([^)]*)\)", text, re.M)  # __array_api_version__ is its last entry
    versions = re.findall(r'"([0-9]{4}\.[0-9]{2})"', m.group(1)) if m else []
    if not versions:
        sys.exit("array_api_suite: no API_VERSIONS in src/laneflow/_array_api.py")
    return versions[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--suite", default=os.environ.get("ARRAY_API_TESTS_DIR") or _beside(),
                   help="a checkout of array-api-tests (copied, never changed); default: $ARRAY_API_TESTS_DIR, "
                        "else ../shared/array-api-tests beside the repository or .array-api-tests in it, else a clone")
    p.add_argument("--device", default=os.environ.get("LANEFLOW_DEVICE", "cpu"), choices=("cpu", "gpu"))
    p.add_argument("--version", default=None,
                   help="the standard version to test (ARRAY_API_TESTS_VERSION); default: lf.__array_api_version__")
    p.add_argument("--max-examples", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--module", default="laneflow",
                   help="the namespace under test (ARRAY_API_TESTS_MODULE); e.g. array_api_strict, the reference, "
                        "for the speed comparison")
    p.add_argument("--times", action="store_true", help="print each test file's seconds at the end")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="laneflow-array-api-") as tmp:
        suite = suite_copy(args.suite, Path(tmp))
        (suite / "laneflow_device_plugin.py").write_text(PLUGIN)
        xfails = Path(tmp) / "xfails.txt"
        xfails.write_text("".join(f"{t}\n" for t in read_xfails(XFAILS)))
        env = dict(os.environ, ARRAY_API_TESTS_MODULE=args.module,
                   ARRAY_API_TESTS_VERSION=args.version or declared_version(), LANEFLOW_DEVICE=args.device,
                   PYTHONPATH=os.pathsep.join([str(suite), str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "laneflow_device_plugin",
               "--hypothesis-seed", str(args.seed), "--max-examples", str(args.max_examples),
               # no deadlines: a per-example time limit is a timed test (speed lives in benchmarks), and one
               # slow example on a loaded CI machine (test_stack, 997 ms against 800, 2026-12-05) failed the
               # run after five minutes of Hypothesis shrinking it; on the GPU first calls compile kernels
               "--hypothesis-disable-deadline",
               "--xfails-file", str(xfails), "--disable-extension", "fft", "-o", "addopts=", "-rf", *(args.pytest_args or ["array_api_tests"])]
        junit = Path(tmp) / "junit.xml"
        if args.times:
            cmd[4:4] = ["--junitxml", str(junit)]
        print(f"+ ARRAY_API_TESTS_MODULE={args.module} ARRAY_API_TESTS_VERSION={env['ARRAY_API_TESTS_VERSION']}",
              " ".join(cmd), flush=True)
        rc = subprocess.run(cmd, cwd=suite, env=env).returncode
        if args.times and junit.exists():
            print_file_times(junit, args.module)
        return rc


def print_file_times(junit: Path, module: str) -> None:
    """Seconds per test file (the sum of its tests' times in pytest's junit XML), longest first."""
    import xml.etree.ElementTree as ET

    per: dict = {}
    for case in ET.parse(junit).iter("testcase"):
        name = case.get("classname", "").split(".")[-1]
        per[name] = per.get(name, 0.0) + float(case.get("time") or 0.0)
    print(f"\nseconds per test file ({module}):")
    for name, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {name:50s} {t:8.2f}")


if __name__ == "__main__":
    sys.exit(main())
