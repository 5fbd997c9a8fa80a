"""Real nodes check their disk before filling anything (asrpool_harness.localcluster.diskspace)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from asrpool_harness.localcluster import diskspace, imagecache, images

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


def test_a_new_seed_starts_from_the_one_holding_most_of_its_images_by_name(
        tmp_path: Path) -> None:
    cache = tmp_path / "seeds"
    cache.mkdir()
    server, pause = (images.Image(name, f"{name}@1", stored=True) for name in ("server", "pause"))
    full = imagecache.ensure(cache, [server, pause], lambda folder: (folder / "root").mkdir())
    (full / "marker").write_text("server and pause")
    imagecache.ensure(cache, [pause],  # newer, of fewer images
                      lambda folder: (folder / "root" / "marker").unlink())
    rebuilt = images.Image("server", "server@2", stored=True)
    assert imagecache.to_import(cache, [rebuilt, pause]) == ([rebuilt], False)
    seed = imagecache.ensure(cache, [rebuilt, pause], lambda folder: None)
    assert (seed / "marker").read_text() == "server and pause"  # a copy of the full seed


def test_chain_ids_follow_the_oci_image_spec() -> None:
    diff_ids = [f"sha256:{c * 64}" for c in "abc"]
    chain = images.chain_ids(diff_ids)

    def digest(text: str) -> str:
        return f"sha256:{hashlib.sha256(text.encode()).hexdigest()}"

    assert chain[0] == diff_ids[0]
    assert chain[1] == digest(f"{diff_ids[0]} {diff_ids[1]}")
    assert chain[2] == digest(f"{chain[1]} {diff_ids[2]}")
    assert images.chain_ids([]) == []


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
