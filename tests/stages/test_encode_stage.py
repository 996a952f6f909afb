"""The encode stage (stages/encode.py): aligned outputs, the embedding cache across runs, precomputed embeddings,
a kill and resume, Ctrl-C, and its errors."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from helpers import (
    CATALOG,
    EMBEDDINGS,
    ENCODE_OUTPUTS,
    IDS,
    SCORE_OUTPUTS,
    assert_no_outputs,
    assert_user_error,
    plant_stale,
    read_csv,
    run_fails,
    run_in_process,
    run_module,
    run_ok,
    set_params,
    tiny_project,
    tool_env,
)
from hostile_cases import rgb_block
from recallk import images
from recallk.encode.registry import get_backbone

pytestmark = pytest.mark.stage  # every test here runs the stages (in process, helpers.run_in_process, unless it says)


def _encode(project):
    proc = run_ok(project, "encode")
    return proc.stderr, (project / EMBEDDINGS).read_bytes()


def test_encode_stage_writes_aligned_outputs(scored_base):
    emb = np.load(scored_base / EMBEDDINGS, allow_pickle=False)
    ids = np.load(scored_base / IDS, allow_pickle=False)
    cat = pd.read_csv(scored_base / CATALOG, dtype=str)
    assert emb.dtype == np.float32 and emb.shape == (200, 768)
    assert ids.tolist() == cat["image_id"].tolist()
    first = images.load(scored_base / cat["path"][0])
    np.testing.assert_array_equal(emb[0], get_backbone("pixels", {"resolution": 16}).encode([first])[0])


def test_stage_serves_the_second_run_from_the_cache(split_project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    log1, emb1 = _encode(split_project)
    assert "encoded 200 images, served 0 from the cache" in log1
    assert (tmp_path / "cache" / "embeddings.sqlite").is_file()
    log2, emb2 = _encode(split_project)
    assert "encoded 0 images, served 200 from the cache" in log2
    assert emb2 == emb1


def test_stage_precomputed_follows_catalog_order(split_project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    ids = pd.read_csv(split_project / CATALOG, dtype=str)["image_id"].to_numpy(dtype=str)
    want = np.random.default_rng(1).standard_normal((len(ids), 6)).astype(np.float32)
    order = np.random.default_rng(2).permutation(len(ids))
    np.savez(split_project / "pre.npz", ids=np.append(ids[order], "extra"),
             embeddings=np.vstack([want[order], np.ones(6)]))
    set_params(split_project, {"encode.backbone": "precomputed",
                               "encode.precomputed": {"path": "pre.npz", "ids": "recallk/encode/no_file.txt"}})
    log, _ = _encode(split_project)
    assert "loaded 200 precomputed embeddings (dim 6)" in log
    np.testing.assert_array_equal(np.load(split_project / EMBEDDINGS), want)


SLOWENC = """import time
import numpy as np

def embed(images):
    time.sleep(0.2)
    return np.array([np.concatenate([np.asarray(i, dtype=np.float32).mean((0, 1)),
                                     np.asarray(i.resize((4, 4)), dtype=np.float32).ravel()]) for i in images])
"""


def _cache_rows(db_path):
    if not db_path.is_file():
        return 0
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=1)) as db:
            return db.execute("SELECT count(*) FROM embedding").fetchone()[0]
    except sqlite3.OperationalError:  # the table is not created yet
        return 0


def test_stage_resumes_after_sigkill(split_project, tmp_path, monkeypatch):
    project = split_project
    (project / "slowenc.py").write_text(SLOWENC)
    set_params(project, {"encode.backbone": "callable:slowenc:embed", "encode.callable.module_file": "slowenc.py",
                          "encode.batch_size": 10})
    cache_dir = tmp_path / "cache"
    db_path = cache_dir / "embeddings.sqlite"
    env = {**tool_env(), "RECALLK_CACHE_DIR": str(cache_dir)}
    proc = subprocess.Popen([sys.executable, "-m", "stages.encode"], cwd=project, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _cache_rows(db_path) < 30 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the encode run finished before it could be killed"
        assert _cache_rows(db_path) >= 30, "the cache did not fill within 60 s"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    out_dir = project / "data/embeddings"
    assert not (out_dir / "embeddings.npy").exists() and not (out_dir / "ids.npy").exists()
    assert list(project.rglob("*.tmp")) == []
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    n_kept = _cache_rows(db_path)

    monkeypatch.setenv("RECALLK_CACHE_DIR", str(cache_dir))
    log, resumed = _encode(project)
    served = int(log.split(" from the cache")[0].rsplit("served ", 1)[1])
    assert served == n_kept >= 30 and f"encoded {200 - served} images, served {served} " in log

    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "fresh"))
    log, fresh = _encode(project)
    assert "encoded 200 images, served 0 from the cache" in log
    assert resumed == fresh


def test_unknown_backbone_lists_available_and_suggests(split_project):
    set_params(split_project, {"encode.backbone": "pixel"})
    run_fails(split_project, "encode", "unknown backbone 'pixel' in `encode.backbone`", "Did you mean `pixels`?",
              "Available backbones: ", "pixels, precomputed")
    assert_no_outputs(split_project, ENCODE_OUTPUTS + SCORE_OUTPUTS)
    assert (split_project / CATALOG).is_file()  # the split outputs are untouched


# ---------------------------------------------------------------- Ctrl-C (issue 25)
# Ctrl-C in encode said nothing of the cache (moved from the hostile corpus, test_hostile_cache.py). The stage runs
# as a subprocess and gets a real SIGINT: the command line's exit 130.


SIGINT_AFTER_ONE_BATCH = """
import os, signal
import numpy as np
calls = []
def embed(images):
    calls.append(1)
    if len(calls) == 2:
        os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C during the second batch
    return np.array([np.asarray(i, float).mean((0, 1)) + 1 for i in images])
"""


def test_ctrl_c_in_encode_says_what_is_cached_and_that_a_rerun_resumes(tmp_path):
    proj = tiny_project(tmp_path)
    run_ok(proj, "split")
    (proj / "sigint_enc.py").write_text(SIGINT_AFTER_ONE_BATCH)
    set_params(proj, {"encode.backbone": "callable:sigint_enc:embed", "encode.callable.module_file": "sigint_enc.py",
                      "encode.batch_size": 4})
    proc = run_module("stages.encode", cwd=proj)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error: interrupted (Ctrl-C) while encoding with 'sigint_enc:embed': 4 of the 12 distinct images are " \
           "in the embedding cache" in proc.stderr
    assert "a re-run resumes from them; no output was written." in proc.stderr
    assert not (proj / "data" / "embeddings" / "embeddings.npy").exists()


# ---------------------------------------------------------------- callables and precomputed files (issue 25)
# Moved from the hostile corpus (test_hostile_messages.py), on the tiny project (helpers.tiny_project): a
# callable that raised or exited, and precomputed files that ended in a traceback or were read wrong.


def catalog_ids(proj: Path) -> list[str]:
    return read_csv(proj, CATALOG)["image_id"].tolist()


@pytest.fixture
def split_done(tmp_path: Path) -> Path:
    """The tiny project (helpers.tiny_project) after the split stage."""
    proj = tiny_project(tmp_path)
    run_ok(proj, "split")
    return proj


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


def test_complex_precomputed_embeddings_are_refused(split_done):
    """silent: complex vectors were cast to their real part with exit 0."""
    ids = catalog_ids(split_done)
    emb = np.random.default_rng(0).normal(size=(len(ids), 4)) * (1 + 1j)
    np.savez(split_done / "e.npz", ids=np.array(ids), embeddings=emb.astype(np.complex64))
    _precomputed(split_done, "e.npz")
    run_fails(split_done, "encode", "dtype complex64", "complex numbers")
    assert_no_outputs(split_done, ENCODE_OUTPUTS)


def test_a_bom_in_ids_txt_is_not_part_of_the_first_id(split_done):
    """message: a UTF-8 BOM (Windows editors) made the first id unknown: '1 catalog image(s) have no embedding'."""
    ids = catalog_ids(split_done)
    (split_done / "ids.txt").write_bytes(b"\xef\xbb\xbf" + "\n".join(ids).encode("utf-8") + b"\n")
    emb = np.random.default_rng(1).normal(size=(len(ids), 4)).astype(np.float32)
    np.save(split_done / "e.npy", emb)
    _precomputed(split_done, "e.npy", "ids.txt")
    run_ok(split_done, "encode")
    np.testing.assert_array_equal(np.load(split_done / EMBEDDINGS), emb)


def test_an_npy_header_claiming_10_12_rows_is_refused_before_allocation(split_done):
    """It was allocated first: ``_ArrayMemoryError: Unable to allocate 29.1 TiB`` (a traceback). (Moved from the
    hostile corpus's limits, test_hostile_limits.py.)"""
    np.save(split_done / "ids.npy", np.array(catalog_ids(split_done)))
    npy_with_header(split_done / "e.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 8), }",
                    b"\x00" * 64)
    _precomputed(split_done, "e.npy", "ids.npy")
    run_fails(split_done, "encode", "header claims shape (1000000000000, 8)", "32,000,000,000,000 bytes",
              "the file holds 64 bytes")


# ---------------------------------------------------------------- embeddings that are no embeddings
# Moved from the hostile-input corpus (test_hostile_manifests.py), on the tiny project (helpers.tiny_project).


HOSTILE_ENCODER = '''\
import numpy as np


def embed(images):
    """Mean colour, but NaN for a pure red image, +inf for pure green, -inf for pure blue."""
    out = []
    for img in images:
        arr = np.asarray(img, dtype=np.float64)
        v = arr.mean(axis=(0, 1)) / 255 + 0.01
        corner = tuple(int(x) for x in arr[0, 0])
        if corner == (255, 0, 0):
            v[0] = np.nan
        elif corner == (0, 255, 0):
            v[1] = np.inf
        elif corner == (0, 0, 255):
            v[2] = -np.inf
        out.append(v)
    return np.asarray(out, dtype=np.float32)
'''


def test_callable_backbone_returning_nan_or_inf_names_the_images(tmp_path):
    proj = tiny_project(tmp_path)
    (proj / "hostile_encoder.py").write_text(HOSTILE_ENCODER)
    bad = {"a/red.png": (255, 0, 0), "b/green.png": (0, 255, 0), "c/blue.png": (0, 0, 255)}
    for rel, colour in bad.items():
        Image.fromarray(rgb_block(8, 8, colour), "RGB").save(proj / "data" / "digits" / rel)
    set_params(proj, {"encode.backbone": "callable:hostile_encoder:embed",
                      "encode.callable.module_file": "hostile_encoder.py"})
    run_ok(proj, "split")
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_in_process("encode", cwd=proj)
    assert_user_error(proc, "NaN, inf or all-zero", f"{len(bad)} image(s)", *bad)
    for good in ("a/0.png", "b/0.png"):
        assert good not in proc.stderr
    assert_no_outputs(proj, (EMBEDDINGS, IDS))


@pytest.fixture(scope="module")
def split_template(tmp_path_factory):
    """A project whose split already ran (the precomputed cases only re-run encode)."""
    proj = tiny_project(tmp_path_factory.mktemp("split_template"))
    run_ok(proj, "split")
    return proj


def _stored(ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    emb = np.random.default_rng(0).normal(size=(len(ids), 5)).astype(np.float32)
    return np.asarray(ids), emb


PRECOMPUTED_CASES = {
    # (ids, emb) -> arrays to save, fragments the error must contain
    "vector_not_matrix": (lambda ids, emb: (ids, emb[:, 0]), ["2-D", "(n, d)"]),
    "three_dims": (lambda ids, emb: (ids, emb[:, :, None]), ["2-D", "(n, d)"]),
    "zero_width": (lambda ids, emb: (ids, emb[:, :0]), []),
    "ids_rows_mismatch": (lambda ids, emb: (ids, np.vstack([emb, emb[:1]])), ["ids of shape"]),
    "missing_ids": (lambda ids, emb: (ids[2:], emb[2:]), ["2 catalog image(s) have no embedding", "{0}", "{1}"]),
    "zero_vectors": (lambda ids, emb: (ids, np.where(np.isin(np.arange(len(ids)), [1, 4])[:, None], 0, emb)),
                     ["all-zero", "2 image(s)", "{1}", "{4}"]),
}


@pytest.mark.parametrize("case", list(PRECOMPUTED_CASES), ids=list(PRECOMPUTED_CASES))
def test_precomputed_embeddings_errors(split_template, tmp_path, case):
    proj = tmp_path / "proj"
    shutil.copytree(split_template, proj, symlinks=True)
    ids = read_csv(proj, CATALOG)["image_id"].tolist()
    make, fragments = PRECOMPUTED_CASES[case]
    stored_ids, stored = make(*_stored(ids))
    np.savez(proj / "emb.npz", ids=stored_ids, embeddings=stored)
    set_params(proj, {"encode.backbone": "precomputed", "encode.precomputed.path": "emb.npz"})
    plant_stale(proj, (EMBEDDINGS, IDS))
    proc = run_in_process("encode", cwd=proj)
    assert_user_error(proc, "emb.npz", *(f.format(*ids) for f in fragments))
    assert_no_outputs(proj, (EMBEDDINGS, IDS))
