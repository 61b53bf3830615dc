"""Every package folder is listed in pyproject.toml, so a regular (non-editable) install ships it."""
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
def test_all_package_folders_are_listed():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for top in ("app", "engine", "assets"):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(".".join(("qwenlocal", top, *rel.parts)))
    assert found == listed, f"unlisted: {sorted(found - listed)}; stale: {sorted(listed - found)}"


def _extras():
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
def test_dev_extra_does_not_pin_triton_against_torch():
    # torch from the public index pins its own triton (2.13 -> 3.7.1); an exact pin here made the README's
    # install unresolvable. .ci/check_resolution checks the real resolution; this catches the pin offline.
    from packaging.requirements import Requirement

    triton = [r for r in map(Requirement, _extras()["dev"]) if r.name == "triton"]
    assert triton and all(s.operator not in ("==", "===", "~=") for r in triton for s in r.specifier), triton


@pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is 3.11+")
def test_gpu_extra_is_linux_only():
    from packaging.requirements import Requirement

    for req in map(Requirement, _extras()["gpu"]):
        assert req.marker is not None, f"{req.name}: no wheels on Windows, needs a Linux marker"
        assert req.marker.evaluate({"platform_system": "Linux", "sys_platform": "linux"})
        assert not req.marker.evaluate({"platform_system": "Windows", "sys_platform": "win32"})


def test_ci_runs_the_resolution_check():
    assert ".ci/check_resolution" in (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv .venv" in (ROOT / "README.md").read_text()
