"""Real nodes check their disk before filling anything (asrpool.localcluster.diskspace)."""

from __future__ import annotations

import shutil
from pathlib import Path

from asrpool.localcluster import diskspace, imagecache, images

GIB = diskspace.GIB


def test_a_first_seed_needs_room_for_its_images_and_a_later_one_only_the_nodes() -> None:
    assert diskspace.needed(8 * GIB, first_seed=True) == diskspace.RUNNING_BYTES + 12 * GIB
    assert diskspace.needed(8 * GIB, first_seed=False) == diskspace.RUNNING_BYTES


def test_a_disk_too_small_is_told_in_one_line_with_both_figures(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    told = diskspace.problem(tmp_path, 2 * free, first_seed=True)
    assert told is not None and "\n" not in told
    assert f"{diskspace.needed(2 * free, True) / GIB:.1f} GB" in told
    assert f"it has {free / GIB:.1f} GB" in told and "a first seed" in told
    assert diskspace.problem(tmp_path, 0, first_seed=False) is None  # 2 GB: this disk has it


def test_only_an_empty_cache_makes_a_first_seed(tmp_path: Path) -> None:
    archive = tmp_path / "tiny.tar"
    archive.write_bytes(b"x" * 1000)
    wanted = [images.Image(str(archive), "tiny@1", stored=False)]
    cache = tmp_path / "seeds"
    cache.mkdir()
    assert imagecache.first_seed(cache, wanted)
    (cache / "older" / "root").mkdir(parents=True)  # another set's seed: copied, not refilled
    assert not imagecache.first_seed(cache, wanted)
    assert images.size(wanted[0]) == 1000
