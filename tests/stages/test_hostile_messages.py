"""Hostile corpus, part 2: inputs that used to end in a traceback or in a misleading message.

Each case names its defect class (issue "Nothing silently wrong"): ``traceback`` (a user error that
ended in a Python traceback, exit 1, or a silent exit 0), ``message`` (a clear message that blamed the
wrong thing), ``silent`` (a wrong or dropped value with exit 0). Every case failed on the code before
this file and passes after. Stage runs are real subprocesses on tiny generated data (8 x 8 images,
the pixels backbone at resolution 4), as in test_hostile_corpus.py.
"""

from __future__ import annotations

import errno
import os
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers import (
    CATALOG,
    EMBEDDINGS,
    ENCODE_OUTPUTS,
    SPLIT_OUTPUTS,
    assert_no_outputs,
    read_csv,
    run_fails,
    run_ok,
    save_image,
    set_params,
    tiny_project,
)
from recallk.data import catalog, contract
from recallk.errors import InputError, os_advice
from stages import runner

LABELS = ("a", "b", "c", "d")


def tiny(where: Path, labels: tuple[str, ...] = LABELS) -> Path:
    return tiny_project(where, labels)


@pytest.fixture
def proj(tmp_path: Path) -> Path:
    return tiny(tmp_path)


def rows(labels: tuple[str, ...] = LABELS) -> str:
    return "".join(f"{label}/{i}.png,{label}\n" for label in labels for i in range(3))


def manifest(proj: Path, text: str) -> None:
    (proj / "data" / "digits" / "manifest.csv").write_text(text, encoding="utf-8")
    set_params(proj, {"split.csv": "manifest.csv"})


def catalog_ids(proj: Path) -> list[str]:
    return read_csv(proj, CATALOG)["image_id"].tolist()


# ================================================================ manifests and names (split)


@pytest.mark.stage
def test_nul_byte_in_a_manifest_path_is_a_contract_failure(proj):
    """traceback: ``ValueError: embedded null byte`` from os.stat; now the path rule names the row."""
    manifest(proj, "path,label\n" + rows() + "a/\x000.png,a\n")
    run_fails(proj, "split", contract.PATH_RULE, "CSV line 14", r"'a/\x000.png'")
    assert_no_outputs(proj, SPLIT_OUTPUTS)


@pytest.mark.stage
@pytest.mark.parametrize("header, shown", [
    ("path,label,label ", "'label' as 'label', 'label '"),  # traceback: collide once stripped (AttributeError)
    ("path,label,label", "'label' as 'label', 'label'"),    # silent: pandas renamed the second `label.1`
    (" path,path,label", "'path' as ' path', 'path'"),      # the same for any column
])
def test_manifest_header_naming_a_column_twice_is_refused(proj, header, shown):
    manifest(proj, header + "\n" + "".join(f"{label}/{i}.png,{label},x\n" for label in LABELS for i in range(3)))
    run_fails(proj, "split", "names a column more than once in its header", shown, "give every column its own name")


@pytest.mark.stage
@pytest.mark.parametrize("where", ["file", "folder"])
def test_non_utf8_names_are_named_not_a_traceback(proj, where):
    """traceback: ``UnicodeEncodeError`` at the catalog CSV write; now every such name is listed."""
    root = os.fsencode(proj / "data" / "digits")
    target = root + (b"/a/\xff.png" if where == "file" else b"/\xfe/0.png")
    save_image(Path(os.fsdecode(target)), seed=9, size=(8, 8))
    run_fails(proj, "split", "has a name that is not UTF-8 text", r"b'\xff.png'" if where == "file" else r"b'\xfe'",
              "rename it")
    assert_no_outputs(proj, SPLIT_OUTPUTS)


@pytest.mark.stage
def test_line_break_in_a_manifest_label_is_refused_like_a_label_folder(proj):
    """silent: a label ``"a\\nb"`` from a manifest was a fifth label (folder mode refused it): one rule now."""
    manifest(proj, "path,label\n" + rows().replace("a/0.png,a", 'a/0.png,"a\nb"'))
    run_fails(proj, "split", contract.LABEL_TEXT_RULE, "CSV line 2")


@pytest.mark.stage
def test_label_rule_is_the_same_for_folders(tmp_path):
    """The one label rule, in folder mode (a label folder with a tab in its name)."""
    proj = tiny(tmp_path, labels=("a", "b\tc", "d"))
    run_fails(proj, "split", contract.LABEL_TEXT_RULE)


# ================================================================ misleading messages (split)


@pytest.mark.stage
@pytest.mark.parametrize("make, said", [
    (lambda p: os.mkfifo(p), "is not a regular file (a FIFO, socket or device)"),  # was "file does not exist"
    (lambda p: p.mkdir(), "is a folder, not an image file"),                       # was "file does not exist"
])
def test_fifo_and_folder_say_what_they_are(proj, make, said):
    make(proj / "data" / "digits" / "a" / "odd.png")
    manifest(proj, "path,label\n" + rows() + "a/odd.png,a\n")
    proc = run_fails(proj, "split", "CSV line 14, path 'a/odd.png'", said)
    assert "does not exist" not in proc.stderr


@pytest.mark.stage
def test_colon_in_a_label_folder_is_an_ordinary_character(tmp_path):
    """message: ``type:A/0.png`` was refused as an unsafe path; only drive letters and URL schemes are."""
    proj = tiny(tmp_path, labels=("type:A", "type:B", "c", "d"))
    run_ok(proj, "split", "encode", "score")
    assert {"type:A", "type:B"} <= set(read_csv(proj, CATALOG)["label"])


@pytest.mark.parametrize("path, safe", [
    ("type:A/0.png", True),   # a colon inside a name
    ("a/b:c.png", True),
    ("C:/x.png", False),      # a Windows drive
    ("c:x.png", False),       # drive-relative
    ("s3://bucket/x.png", False),   # a URL scheme
    ("file:///etc/passwd", False),
    ("a/\x00.png", False),    # NUL
    ("a/\n.png", False),      # a line break
])
def test_safe_relative_paths(path, safe):
    assert contract.is_safe_relative(path) is safe


@pytest.mark.parametrize("code, advice, not_advice", [
    (errno.ENAMETOOLONG, "too long for the file system", "free disk space"),
    (errno.EACCES, "fix the permissions", "free disk space"),
    (errno.EROFS, "read-only", "free disk space"),
    (errno.ENOSPC, "free disk space", "permissions"),
    (errno.EFBIG, "ulimit -f", "permissions"),
])
def test_os_errors_get_the_advice_of_their_errno(code, advice, not_advice):
    """message: a too-long name or a permission error was reported as 'free disk space'."""
    got = os_advice(OSError(code, os.strerror(code)))
    assert advice in got and not_advice not in got


@pytest.mark.stage
def test_a_too_long_output_name_is_not_blamed_on_disk_space(proj):
    """The real thing: an output name of 300 characters (ENAMETOOLONG at the temp file)."""
    proc = run_fails(proj, "split", "too long for the file system",
                     args=["--catalog", f"data/prepared/{'x' * 300}.csv"])
    assert "Free disk space" not in proc.stderr and "free disk space" not in proc.stderr


def test_permission_error_raised_in_a_stage_gets_the_permission_advice(capsys):
    """run_stage's last resort: an OSError EACCES says permissions (as root, a real one cannot be made)."""
    def main(argv):
        raise PermissionError(errno.EACCES, "Permission denied", "data/prepared/catalog.csv")

    with pytest.raises(SystemExit) as stop:
        runner.run_stage(main, [])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "fix the permissions" in err and "disk space" not in err


# ================================================================ callables and precomputed files (encode)


@pytest.fixture
def split_done(proj: Path) -> Path:
    run_ok(proj, "split")
    return proj


@pytest.mark.stage
@pytest.mark.parametrize("body, said", [
    ("def f(images):\n    raise RuntimeError('boom')\n", "raised RuntimeError: boom"),  # traceback before
    ("import sys\ndef f(images):\n    sys.exit(0)\n", "called sys.exit(0)"),          # exit 0, no outputs before
    ("import sys\ndef f(images):\n    sys.exit('bye')\n", "called sys.exit('bye')"),
])
def test_a_callable_that_raises_or_exits_is_a_message(split_done, body, said):
    (split_done / "mybb.py").write_text(body)
    set_params(split_done, {"encode.backbone": "callable:mybb:f", "encode.callable.module_file": "mybb.py"})
    run_fails(split_done, "encode", "backbone 'mybb:f'", said, "fix the function")
    assert_no_outputs(split_done, ENCODE_OUTPUTS)


@pytest.mark.stage
@pytest.mark.parametrize("spec", ["callable:builtins:eval", "callable:math:sqrt"])
def test_a_builtin_callable_is_refused(split_done, spec):
    """traceback: ``TypeError: <module 'builtins'> is a built-in module`` from the fingerprint."""
    set_params(split_done, {"encode.backbone": spec})
    run_fails(split_done, "encode", "names a built-in, which has no source file")


def _precomputed(proj: Path, path: str, ids: str | None = None) -> None:
    change = {"encode.backbone": "precomputed", "encode.precomputed.path": path}
    if ids:
        change["encode.precomputed.ids"] = ids
    set_params(proj, change)


@pytest.mark.stage
@pytest.mark.parametrize("members, fragment", [
    # traceback: ``AttributeError: 'bytes' object has no attribute 'ndim'`` (numpy returns raw bytes)
    ({"ids": b"a,b,c", "embeddings.npy": b"not an array"}, "(member 'ids') is not an .npy array"),
    # an .npy name whose header is broken
    ({"ids.npy": b"hello", "embeddings.npy": b"xx"}, "(member 'ids.npy') is not an .npy array"),
])
def test_an_npz_member_that_is_not_an_npy_is_a_message(split_done, members, fragment):
    with zipfile.ZipFile(split_done / "e.npz", "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    _precomputed(split_done, "e.npz")
    run_fails(split_done, "encode", fragment)


def npy_with_header(path: Path, header: str, data: bytes = b"") -> None:
    """An .npy (format 1.0) with a hand-written header dict."""
    raw = header.encode("latin-1")
    raw += b" " * (-(10 + len(raw) + 1) % 64) + b"\n"
    path.write_bytes(b"\x93NUMPY\x01\x00" + len(raw).to_bytes(2, "little") + raw + data)


@pytest.mark.stage
@pytest.mark.parametrize("header", [
    "{'descr': '<f4', 'fortran_order': False, 'shape': (-3, 4), }",   # a negative dimension
    "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 'x'), }",  # not an integer
    "{'descr': '<f4', 'fortran_order': False, 'shape': 12, }",        # not a tuple
])
def test_an_npy_header_with_an_impossible_shape_is_a_message(split_done, header):
    np.save(split_done / "ids.npy", np.array(catalog_ids(split_done)))
    npy_with_header(split_done / "e.npy", header, b"\x00" * 48)
    _precomputed(split_done, "e.npy", "ids.npy")
    run_fails(split_done, "encode", "precomputed embeddings 'e.npy'")


@pytest.mark.stage
def test_complex_precomputed_embeddings_are_refused(split_done):
    """silent: complex vectors were cast to their real part with exit 0."""
    ids = catalog_ids(split_done)
    emb = np.random.default_rng(0).normal(size=(len(ids), 4)) * (1 + 1j)
    np.savez(split_done / "e.npz", ids=np.array(ids), embeddings=emb.astype(np.complex64))
    _precomputed(split_done, "e.npz")
    run_fails(split_done, "encode", "dtype complex64", "complex numbers")
    assert_no_outputs(split_done, ENCODE_OUTPUTS)


@pytest.mark.stage
def test_a_bom_in_ids_txt_is_not_part_of_the_first_id(split_done):
    """message: a UTF-8 BOM (Windows editors) made the first id unknown: '1 catalog image(s) have no embedding'."""
    ids = catalog_ids(split_done)
    (split_done / "ids.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(ids).encode("utf-8") + b"\n")
    emb = np.random.default_rng(1).normal(size=(len(ids), 4)).astype(np.float32)
    np.save(split_done / "e.npy", emb)
    _precomputed(split_done, "e.npy", "ids.txt")
    run_ok(split_done, "encode")
    np.testing.assert_array_equal(np.load(split_done / EMBEDDINGS), emb)


# ================================================================ library level


def test_read_manifest_checks_the_header_before_pandas(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "m.csv").write_text("path,label,label\na/0.png,a,b\n", encoding="utf-8")
    with pytest.raises(InputError, match="names a column more than once"):
        catalog.read_manifest(root, "m.csv")


def test_probe_tells_a_folder_from_a_missing_file(tmp_path):
    (tmp_path / "a" / "x.png").mkdir(parents=True)
    assert "is a folder" in catalog.probe_file(tmp_path, "a/x.png")[4]
    assert "does not exist" in catalog.probe_file(tmp_path, "a/none.png")[4]
