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
