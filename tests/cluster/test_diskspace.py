"""Real nodes check their disk before filling anything (asrpool.localcluster.diskspace)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from asrpool.localcluster import diskspace, imagecache, images

GIB = diskspace.GIB


def test_a_first_seed_needs_room_for_its_images_and_a_later_one_for_their_layouts() -> None:
    assert diskspace.needed(8 * GIB, first_seed=True) == diskspace.RUNNING_BYTES + 12 * GIB
    assert diskspace.needed(8 * GIB, first_seed=False) == diskspace.RUNNING_BYTES + 8 * GIB
    assert diskspace.needed(0, first_seed=False) == diskspace.RUNNING_BYTES


def test_a_disk_too_small_is_told_in_one_line_with_both_figures(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    told = diskspace.problem(tmp_path, 2 * free, first_seed=True)
    assert told is not None and "\n" not in told
    assert f"{diskspace.needed(2 * free, True) / GIB:.1f} GB" in told
    assert f"it has {free / GIB:.1f} GB" in told and "a first seed of" in told
    assert diskspace.problem(tmp_path, 0, first_seed=False) is None  # 2 GB: this disk has it


def test_a_seed_imports_what_the_newest_seed_does_not_hold(tmp_path: Path) -> None:
    archives = []
    for name in ("one", "two"):
        (tmp_path / f"{name}.tar").write_bytes(b"x" * 1000)
        archives.append(images.Image(str(tmp_path / f"{name}.tar"), f"{name}@1", stored=False))
    cache = tmp_path / "seeds"
    cache.mkdir()
    assert imagecache.to_import(cache, archives) == (archives, True)  # nothing to start from
    seed = imagecache.ensure(cache, archives[:1], lambda folder: (folder / "root").mkdir())
    assert json.loads((seed.parent / imagecache.IDENTITIES).read_text()) == ["one@1"]
    assert imagecache.to_import(cache, archives) == (archives[1:], False)
    assert imagecache.to_import(cache, archives[:1]) == ([], False)  # its own seed exists
    (seed.parent / imagecache.IDENTITIES).unlink()  # a seed made before seeds said
    assert imagecache.to_import(cache, archives) == ([], False)
    assert images.size(archives[0]) == 1000


def test_a_seed_half_built_is_removed_whether_its_build_failed_or_was_killed(
        tmp_path: Path) -> None:
    archive = tmp_path / "one.tar"
    archive.write_bytes(b"x" * 1000)
    wanted = [images.Image(str(archive), "one@1", stored=False)]
    cache = tmp_path / "seeds"
    cache.mkdir()

    def fails(folder: Path) -> None:
        (folder / "root").mkdir()
        (folder / "root" / "layer").write_bytes(b"x" * 1000)
        raise OSError("no space left on device")

    with pytest.raises(OSError, match="no space"):
        imagecache.ensure(cache, wanted, fails)
    assert list(cache.iterdir()) == []
    killed = cache / f".{imagecache.key(wanted)}.{_ended_pid()}"
    running = cache / f".{imagecache.key(wanted)}.1"  # another builder, still at work
    for partial in (killed, running):
        (partial / "root").mkdir(parents=True)
    seed = imagecache.ensure(cache, wanted, lambda folder: (folder / "root").mkdir())
    assert seed.is_dir() and not killed.exists() and running.exists()


def _ended_pid() -> int:
    """The pid of a process that has ended (not reused so soon)."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid
