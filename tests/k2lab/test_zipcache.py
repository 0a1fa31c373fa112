"""The lab hosts' bytecode cache for modules imported from zip files (k2lab/host_python):
the same source from another zip is loaded from the cache, named for the zip it came from this
time, and behaves the same; other source is compiled."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k2lab.hosts import ZIPCACHE

SOURCE = "def where():\n    return __file__, where.__code__.co_filename\n\nVALUE = 6 * 7\n"


def payload(path: Path, source: str) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("lab_payload_module.py", source)
    return path


def import_from(archive: Path, cache: Path, *, compile_allowed: bool) -> dict[str, object]:
    """Import the zip's module in a fresh interpreter with the cache loaded, as a lab host's
    python3 does; without `compile_allowed`, compiling from source fails the import."""
    script = f"""
import json, sys
sys.path.insert(0, {str(ZIPCACHE.parent)!r})
import k2lab_zipcache
k2lab_zipcache.CACHE = {str(cache)!r}
if not {compile_allowed!r}:
    def refuse(pathname, source):
        raise RuntimeError("compiled from source")
    k2lab_zipcache._compile_source = refuse
sys.path.insert(0, {str(archive)!r})
import lab_payload_module as m
print(json.dumps({{"file": m.where()[0], "code_file": m.where()[1], "value": m.VALUE}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_the_same_source_from_another_zip_comes_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = payload(tmp_path / "first.zip", SOURCE)
    got = import_from(first, cache, compile_allowed=True)
    assert got["value"] == 42
    assert len(list(cache.iterdir())) == 1
    second = payload(tmp_path / "second.zip", SOURCE)
    again = import_from(second, cache, compile_allowed=False)
    assert again["value"] == 42
    assert again["code_file"] == again["file"] == str(second / "lab_payload_module.py")


def test_other_source_is_compiled_not_taken_from_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    import_from(payload(tmp_path / "a.zip", SOURCE), cache, compile_allowed=True)
    changed = payload(tmp_path / "b.zip", SOURCE.replace("6 * 7", "6 * 8"))
    assert import_from(changed, cache, compile_allowed=True)["value"] == 48
    assert len(list(cache.iterdir())) == 2
    with pytest.raises(AssertionError, match="compiled from source"):
        import_from(payload(tmp_path / "c.zip", SOURCE + "# new\n"), cache, compile_allowed=False)
