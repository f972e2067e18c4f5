"""The hub stand-in's listings pinned to huggingface_hub's own docstrings (read from the installed package): the
shapes its tree, paths-info and model_info answers must have, and the ids the Hub gives an LFS file."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from huggingface_hub.hf_api import ModelInfo, RepoFile

from tests.hubstub import StubFile, git_blob_id, lfs_pointer, sibling, tree_entry

# RepoFile(path='pytorch_model.bin', size=548123560, blob_id='64ea...', lfs={'size': ..., 'sha256': ..., ...}
_LFS_ENTRY = re.compile(r"RepoFile\(\s*path='([^']+)', size=(\d+), blob_id='([0-9a-f]{40})',\s*lfs=(\{[^}]*\})")


def _documented_lfs_files() -> list[tuple[str, int, str, dict]]:
    doc = HfApi.list_repo_tree.__doc__ or ""
    found = [(path, int(size), blob_id, ast.literal_eval(lfs)) for path, size, blob_id, lfs in _LFS_ENTRY.findall(doc)]
    assert any(path == "pytorch_model.bin" for path, *_ in found), "huggingface_hub's list_repo_tree example moved"
    return found


@pytest.mark.parametrize("documented", _documented_lfs_files(), ids=lambda d: d[0])
def test_an_lfs_files_blob_id_is_its_pointers_git_id_as_the_hub_lists_it(documented) -> None:
    """gpt2's pytorch_model.bin: sha1 of "blob 134\\0" + its pointer is the blob_id the docstring shows."""
    path, size, blob_id, lfs = documented
    pointer = lfs_pointer(lfs["sha256"], size)
    assert len(pointer) == lfs["pointer_size"] and git_blob_id(pointer) == blob_id
    f = StubFile(path, Path("/nonexistent"), size, blob_id, lfs["sha256"], True, size)
    listed = RepoFile(**tree_entry(f))  # what list_repo_tree and get_paths_info build from the stub's JSON
    assert (listed.path, listed.size, listed.blob_id, dict(listed.lfs)) == (path, size, blob_id, lfs)
    [info] = ModelInfo(id="gpt2", sha="0" * 40, siblings=[sibling(f, blobs=True)]).siblings
    assert (info.rfilename, info.size, info.blob_id, dict(info.lfs)) == (path, size, blob_id, lfs)


def test_a_regular_files_blob_id_is_gits_id_of_its_bytes_and_it_has_no_lfs() -> None:
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # `git hash-object /dev/null`
    f = StubFile("config.json", Path("/nonexistent"), 0, git_blob_id(b""), "e3b0" + "0" * 60, False, 0)
    listed = RepoFile(**tree_entry(f))
    assert (listed.blob_id, listed.lfs) == ("e69de29bb2d1d6434b8b29ae775ad8c2e48c5391", None)
    [info] = ModelInfo(id="org/m", sha="0" * 40, siblings=[sibling(f, blobs=True)]).siblings
    assert (info.size, info.blob_id, info.lfs) == (0, listed.blob_id, None)
