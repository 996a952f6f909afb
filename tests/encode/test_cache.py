"""The embedding cache, cached encoding, user callables, precomputed embeddings, JPEG draft, kill/resume."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from recallk import images
from recallk.encode import precomputed
from recallk.encode.registry import get_backbone
from recallk.errors import InputError
from recallk.encode.cache import EmbeddingCache
from recallk.encode.batches import encode_catalog, read_checked

from conftest import run_module, save_image, tool_env

FP = "fp-a"


def _vectors(n, dim=5, seed=0):
    return np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)


def _sha(i):
    return hashlib.sha256(str(i).encode()).hexdigest()


def _row(path, image_id):
    return {"image_id": image_id, "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}


def _catalog(folder, seeds, prefix="id"):
    """One random PNG per seed; equal seeds give files with identical content."""
    return pd.DataFrame([_row(save_image(folder / f"{prefix}{i}.png", seed=s), f"{prefix}{i}") for i, s in enumerate(seeds)])


def _counting(resolution=4):
    """The pixels backbone, recording how many images it was asked to encode."""
    base, seen = get_backbone("pixels", {"resolution": resolution}), []

    def encode(imgs):
        seen.append(len(imgs))
        return base.encode(imgs)

    return dataclasses.replace(base, encode=encode), seen


# --- EmbeddingCache -----------------------------------------------------------------------------------------------

def test_cache_round_trip_is_byte_exact_and_survives_reopening(tmp_path):
    vecs = _vectors(4)
    vecs[0, 0] = np.float32(1e-45)  # a subnormal survives too
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(i) for i in range(4)], vecs)
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        got = cache.get_many([_sha(i) for i in range(5)])  # _sha(4) was never stored
    assert sorted(got) == sorted(_sha(i) for i in range(4))
    for i in range(4):
        assert got[_sha(i)].dtype == np.float32 and got[_sha(i)].tobytes() == vecs[i].tobytes()


def test_cache_entries_of_another_fingerprint_are_invisible(tmp_path):
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(0)], _vectors(1))
    with EmbeddingCache(tmp_path / "c.sqlite", "fp-b") as other:
        assert other.get_many([_sha(0)]) == {}


def test_cache_ignores_a_blob_of_the_wrong_length(tmp_path):
    path = tmp_path / "c.sqlite"
    with EmbeddingCache(path, FP) as cache:
        cache.put_many([_sha(0)], _vectors(1))
    with contextlib.closing(sqlite3.connect(path)) as db, db:  # dim 5 but only 3 floats: a damaged entry
        db.execute("INSERT INTO embedding VALUES (?, ?, ?, ?)", (FP, _sha(1), 5, np.ones(3, "<f4").tobytes()))
    with EmbeddingCache(path, FP) as cache:
        assert list(cache.get_many([_sha(0), _sha(1)])) == [_sha(0)]


def test_cache_get_many_chunks_beyond_500_keys(tmp_path):
    n = 1234
    vecs = _vectors(n, dim=3)
    with EmbeddingCache(tmp_path / "c.sqlite", FP) as cache:
        cache.put_many([_sha(i) for i in range(n)], vecs)
        got = cache.get_many([_sha(i) for i in range(n + 10)] + [_sha(0)])  # repeated key too
    assert len(got) == n
    np.testing.assert_array_equal(np.stack([got[_sha(i)] for i in range(n)]), vecs)


# --- encode_catalog with a cache -------------------------------------------------------------------------------

def test_encode_catalog_encodes_each_file_once(tmp_path):
    backbone, seen = _counting()
    cat6 = _catalog(tmp_path, range(6))
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        first, n_enc, n_hit = encode_catalog(cat6, backbone, batch_size=4, num_workers=2, cache=cache)
        assert (n_enc, n_hit, sum(seen)) == (6, 0, 6)
        again, n_enc, n_hit = encode_catalog(cat6, backbone, batch_size=4, num_workers=2, cache=cache)
        assert (n_enc, n_hit, sum(seen)) == (0, 6, 6)
        assert again.dtype == np.float32 and again.tobytes() == first.tobytes()
        cat8 = pd.concat([cat6, _catalog(tmp_path, [100, 101], prefix="new")], ignore_index=True)
        grown, n_enc, n_hit = encode_catalog(cat8.sample(frac=1, random_state=0), backbone, batch_size=4,
                                             num_workers=2, cache=cache)
        assert (n_enc, n_hit, sum(seen)) == (2, 6, 8)
    uncached, _, _ = encode_catalog(cat8.sample(frac=1, random_state=0), get_backbone("pixels", {"resolution": 4}),
                                    batch_size=3, num_workers=1)
    assert grown.tobytes() == uncached.tobytes()


def test_encode_catalog_identical_files_are_encoded_once(tmp_path):
    backbone, seen = _counting()
    cat = _catalog(tmp_path, [7, 8, 7])  # rows 0 and 2: same content, different files and ids
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=8, num_workers=1, cache=cache)
    assert (n_enc, n_hit, sum(seen)) == (2, 0, 2)
    np.testing.assert_array_equal(out[0], out[2])
    assert not np.array_equal(out[0], out[1])


RED, GREEN = (255, 0, 0), (0, 255, 0)


def _flaky():
    """Pixels, except a NaN row for red images and an all-zero row for green ones."""
    base = get_backbone("pixels", {"resolution": 4})

    def encode(imgs):
        emb = base.encode(imgs)
        for i, img in enumerate(imgs):
            emb[i] = np.nan if img.getpixel((0, 0)) == RED else 0 if img.getpixel((0, 0)) == GREEN else emb[i]
        return emb

    return dataclasses.replace(base, name="flaky", encode=encode, fingerprint="flaky")


def _coloured_catalog(folder, spec):
    """``(image_id, colour, side)`` rows: a solid image, or a random one for colour None."""
    rows = []
    for image_id, colour, side in spec:
        path = folder / f"{image_id}.png"
        if colour:
            Image.new("RGB", (side, side), colour).save(path)
        else:
            save_image(path, seed=len(rows))
        rows.append(_row(path, image_id))
    return rows


def test_bad_embeddings_are_named_and_good_ones_are_kept(tmp_path):
    backbone = _flaky()
    rows = _coloured_catalog(tmp_path, [("ok0", None, 6), ("nan1", RED, 6), ("ok2", None, 6), ("zero3", GREEN, 6),
                                        ("ok4", None, 6), ("nan5", RED, 7)])
    cat = pd.DataFrame(rows)
    with EmbeddingCache(tmp_path / "c.sqlite", backbone.fingerprint) as cache:
        with pytest.raises(InputError, match=r"all-zero embeddings for 3 image\(s\): ") as err:
            encode_catalog(cat, backbone, batch_size=2, num_workers=2, cache=cache)
        assert set(re.search(r"image\(s\): (.*?); check", str(err.value))[1].split(", ")) == {"nan1", "zero3", "nan5"}
        good = cat[cat["image_id"].str.startswith("ok")]["sha256"].tolist()
        assert sorted(cache.get_many(cat["sha256"])) == sorted(good)
        for i in (1, 3, 5):  # fix the bad images: replace them with ordinary ones
            rows[i] = _row(save_image(tmp_path / f"fixed{i}.png", seed=50 + i), rows[i]["image_id"])
        _, n_enc, n_hit = encode_catalog(pd.DataFrame(rows), backbone, batch_size=2, num_workers=2, cache=cache)
    assert (n_enc, n_hit) == (3, 3)


@pytest.mark.parametrize("spec, named", [
    ([("nan0", RED, 6), ("ok1", None, 6), ("zero2", GREEN, 6), ("nan3", RED, 7)], "3 image\\(s\\): nan0, zero2, nan3;"),
    # ^ named in catalog order, as the docstring promises ("encoded, in catalog order")
    ([("ok0", None, 6), ("nan1", RED, 6), ("nan1_copy", RED, 6)], "2 image\\(s\\): nan1, nan1_copy;"),
    # ^ two catalog rows with the same bad file: both rows are unusable, both are named
])
def test_bad_embeddings_name_every_catalog_row_in_order(tmp_path, spec, named):
    with pytest.raises(InputError, match=named):
        encode_catalog(pd.DataFrame(_coloured_catalog(tmp_path, spec)), _flaky(), batch_size=2, num_workers=1)


# --- callable backbones -----------------------------------------------------------------------------------------

@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write ``name.py`` into an importable folder; the modules are forgotten after the test."""
    folder, names = tmp_path / "usermods", []
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))

    def write(name, source):
        (folder / f"{name}.py").write_text(source)
        names.append(name)

    yield write
    for name in names:
        sys.modules.pop(name, None)


MEAN_RGB = "import numpy as np\ndef embed(images):\n    return np.array([np.asarray(i, dtype=float).mean((0, 1)) for i in images])\n"


def test_callable_backbone_infers_dim_and_fingerprints_source(tmp_path, user_module):
    user_module("mymod_ok", MEAN_RGB)
    backbone = get_backbone("callable:mymod_ok:embed")
    assert backbone.dim is None
    cat = _catalog(tmp_path, range(5))
    out, n_enc, _ = encode_catalog(cat, backbone, batch_size=2, num_workers=1)
    assert out.shape == (5, 3) and n_enc == 5
    np.testing.assert_allclose(out[1], np.asarray(images.load(cat["path"][1]), dtype=float).mean((0, 1)), rtol=1e-6)
    assert get_backbone("callable:mymod_ok:embed").fingerprint == backbone.fingerprint  # stable
    user_module("mymod_ok", MEAN_RGB + "# edited\n")
    assert get_backbone("callable:mymod_ok:embed").fingerprint != backbone.fingerprint


@pytest.mark.parametrize("spec, match", [
    ("callable:nomodule", r"is not a valid callable; write it as `callable:package.module:function`"),  # no function
    ("callable::embed", r"is not a valid callable"),                                                      # no module
    ("callable:missing_mod_zz:f", r"cannot import module 'missing_mod_zz'"),                             # not importable
    ("callable:mymod_err:absent", r"module 'mymod_err' has no function 'absent'"),                       # no such name
    ("callable:mymod_err:CONSTANT", r"module 'mymod_err' has no function 'CONSTANT'"),                   # not callable
    ("callable:mymod_syntax:embed", r"cannot import module 'mymod_syntax' for `encode.backbone` \(SyntaxError"),
])
def test_callable_backbone_errors(user_module, spec, match):
    user_module("mymod_err", MEAN_RGB + "CONSTANT = 3\n")
    user_module("mymod_syntax", "def embed(images)\n    return images\n")
    with pytest.raises(InputError, match=match):
        get_backbone(spec)


def test_callable_returning_non_numbers(tmp_path, user_module):
    user_module("mymod_text", "def embed(images):\n    return [['a', 'b'] for _ in images]\n")
    with pytest.raises(InputError, match=r"did not return numbers for a batch of 2 .*return an \(n, d\) array"):
        encode_catalog(_catalog(tmp_path, range(2)), get_backbone("callable:mymod_text:embed"), batch_size=2,
                       num_workers=1)


def test_callable_changing_dimension_between_batches(tmp_path, user_module):
    user_module("mymod_dims", "import numpy as np\ncalls = []\ndef embed(images):\n"
                              "    calls.append(1)\n    return np.ones((len(images), 2 + len(calls)))\n")
    with pytest.raises(InputError, match=r"returned shape \(2, 4\) for a batch of 2; expected \(2, 3\)"):
        encode_catalog(_catalog(tmp_path, range(4)), get_backbone("callable:mymod_dims:embed"), batch_size=2,
                       num_workers=1)


# --- precomputed ------------------------------------------------------------------------------------------------

CAT_IDS = ["a", "b", "c"]
EMB = np.arange(1, 13, dtype=np.float64).reshape(4, 3)  # rows for ids d, c, a, b (d is extra)
STORED_IDS = np.array(["d", "c", "a", "b"])


def _load(path, ids=None):
    return precomputed.align(*precomputed.read_precomputed(str(path), ids and str(ids)), CAT_IDS, source="src")


@pytest.mark.parametrize("layout", ["npz", "npy+npy", "npy+txt"])
def test_precomputed_aligned_to_catalog_order(tmp_path, layout):
    if layout == "npz":
        np.savez(path := tmp_path / "e.npz", ids=STORED_IDS, embeddings=EMB)
        ids = None
    else:
        np.save(path := tmp_path / "e.npy", EMB)
        ids = tmp_path / ("ids.npy" if layout == "npy+npy" else "ids.txt")
        np.save(ids, STORED_IDS) if layout == "npy+npy" else ids.write_text("\n".join(STORED_IDS) + "\n")
    got = _load(path, ids)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, EMB[[2, 3, 1]])


@pytest.mark.parametrize("path, ids, match", [
    (None, None, r"needs `encode.precomputed.path`"),                        # path: null
    ("nowhere.npz", None, r"'nowhere.npz' not found; fix `encode.precomputed.path`"),  # no such file
    ("e.npy", None, r"holds embeddings only; set `encode.precomputed.ids`"),   # .npy without its ids
    ("e.npy", "nowhere.txt", r"ids file 'nowhere.txt' not found"),            # ids file missing
    ("obj.npy", "ids.npy", r"cannot load precomputed embeddings .*no objects"),  # pickled .npy refused
    ("npy.npz", None, r"'npy.npz' is not an .npz archive; save it with numpy.savez"),  # .npy bytes named .npz
    ("broken.npz", None, r"cannot load precomputed embeddings 'broken.npz'"),         # corrupt zip archive
    ("e.npy", "latin1.txt", r"ids file 'latin1.txt' is not UTF-8 text"),              # ids not UTF-8
    ("zip.npy", "ids.npy", r"'zip.npy' is an .npz archive, not one array"),            # .npz bytes named .npy
])
def test_precomputed_file_errors(tmp_path, monkeypatch, path, ids, match):
    monkeypatch.chdir(tmp_path)
    np.save("e.npy", EMB)
    np.save("ids.npy", STORED_IDS)
    np.save("obj.npy", np.array([[{"x": 1}]] * 4, dtype=object), allow_pickle=True)
    with open("npy.npz", "wb") as fh:
        np.save(fh, EMB)
    with open("zip.npy", "wb") as fh:
        np.savez(fh, ids=STORED_IDS, embeddings=EMB)
    (tmp_path / "broken.npz").write_bytes(b"PK\x03\x04 not really a zip archive")
    (tmp_path / "latin1.txt").write_bytes("d\nc\n\xe9t\xe9\nb\n".encode("latin-1"))
    with pytest.raises(InputError, match=match):
        precomputed.read_precomputed(path, ids)


@pytest.mark.parametrize("arrays, match", [
    ({"ids": None}, r"lacks array\(s\) ids; save it with numpy.savez"),               # npz without ids
    ({"embeddings": EMB[:, 0]}, r"numeric 2-D array \(n, d\); got shape \(4,\)"),  # a vector, not a matrix
    ({"ids": STORED_IDS[:3]}, r"ids of shape \(3,\) for 4 embedding rows"),              # ids shorter than rows
    ({"ids": np.array(["a", "b", "c", "a"])}, r"ids repeat"),                         # 'a' twice
    ({"ids": np.array(["d", "c", "x", "b"])}, r"1 catalog image\(s\) have no embedding, e.g. a;"),  # 'a' absent
    ({"embeddings": np.where(np.arange(4)[:, None] == 3, np.nan, EMB)},
     r"NaN, inf or all-zero embeddings for 1 image\(s\): b;"),                       # row of 'b' is NaN
    ({"ids": STORED_IDS.astype(object)}, r"cannot load precomputed embeddings .*no objects"),
    # ^ object ids (e.g. pandas' to_numpy()): np.savez pickles them; refused with a InputError, not unpickled
], ids=["no ids", "1-D", "length", "repeat", "missing id", "nan", "object npz"])
def test_precomputed_npz_errors(tmp_path, arrays, match):
    arrays = {k: v for k, v in {"ids": STORED_IDS, "embeddings": EMB, **arrays}.items() if v is not None}
    np.savez(tmp_path / "e.npz", **arrays)
    with pytest.raises(InputError, match=match):
        _load(tmp_path / "e.npz")


# --- JPEG draft decoding ----------------------------------------------------------------------------------------

@pytest.fixture
def big_jpeg(tmp_path):
    return save_image(tmp_path / "big.jpg", seed=3, size=(2000, 1500), fmt="JPEG").read_bytes()


@pytest.mark.parametrize("min_side, size", [
    (224, (500, 375)),     # 1/4 scale: 1/8 would make the short side 188 < 224
    (16, (250, 188)),      # 1/8, the smallest draft scale
    (750, (1000, 750)),    # 1/2: the short side lands exactly on min_side
    (751, (2000, 1500)),   # no reduction keeps both sides >= 751: full size
])
def test_jpeg_draft_keeps_min_side(big_jpeg, min_side, size):
    img = images.decode(big_jpeg, min_side=min_side)
    assert img.size == size and min(img.size) >= min_side and img.mode == "RGB"


def test_no_draft_without_min_side_or_for_png(tmp_path, big_jpeg):
    assert images.decode(big_jpeg).size == (2000, 1500)
    png = save_image(tmp_path / "big.png", seed=3, size=(800, 600)).read_bytes()
    assert images.decode(png, min_side=16).size == (800, 600)


def test_pixels_backbone_on_drafted_jpeg_is_deterministic(tmp_path, big_jpeg):
    (path := tmp_path / "x.jpg").write_bytes(big_jpeg)
    backbone = get_backbone("pixels", {"resolution": 16})
    decode = lambda: read_checked(str(path), hashlib.sha256(big_jpeg).hexdigest(), backbone.input_size)  # noqa: E731
    assert decode().size == (250, 188)  # 1/8 draft, both sides >= 16
    assert backbone.encode([decode()]).tobytes() == backbone.encode([decode()]).tobytes()


# --- stage level ----------------------------------------------------------------------------------------------

def _set_encode(project, **values):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["encode"].update(values)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _encode(project):
    proc = run_module("stages.encode", cwd=project)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr, (project / "data/embeddings/embeddings.npy").read_bytes()


def test_stage_serves_the_second_run_from_the_cache(project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    assert run_module("stages.split", cwd=project).returncode == 0
    log1, emb1 = _encode(project)
    assert "encoded 200 images, served 0 from the cache" in log1
    assert (tmp_path / "cache" / "embeddings.sqlite").is_file()
    log2, emb2 = _encode(project)
    assert "encoded 0 images, served 200 from the cache" in log2
    assert emb2 == emb1


def test_stage_precomputed_follows_catalog_order(project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    assert run_module("stages.split", cwd=project).returncode == 0
    ids = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)["image_id"].to_numpy(dtype=str)
    want = _vectors(len(ids), dim=6, seed=1)
    order = np.random.default_rng(2).permutation(len(ids))
    np.savez(project / "pre.npz", ids=np.append(ids[order], "extra"), embeddings=np.vstack([want[order], np.ones(6)]))
    _set_encode(project, backbone="precomputed", precomputed={"path": "pre.npz", "ids": None})
    log, _ = _encode(project)
    assert "loaded 200 precomputed embeddings (dim 6)" in log
    np.testing.assert_array_equal(np.load(project / "data/embeddings/embeddings.npy"), want)


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


def test_stage_resumes_after_sigkill(project, tmp_path, monkeypatch):
    (project / "slowenc.py").write_text(SLOWENC)
    _set_encode(project, backbone="callable:slowenc:embed", batch_size=10)
    assert run_module("stages.split", cwd=project).returncode == 0
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
