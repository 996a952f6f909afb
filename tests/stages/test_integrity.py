"""Silent wrong numbers, refused at the root: each test names the mechanism it pins.

Unit and stage-level tests (no ``dvc``); the ``dvc repro`` ones are in test_integrity_pipeline.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from PIL import Image

from helpers import ROOT, run_module, save_image
from recallk import images
from recallk.checks import quote
from recallk.data import catalog, contract, prepare
from recallk.encode.batches import encode_catalog
from recallk.encode.cache import EmbeddingCache
from recallk.encode.registry import get_backbone
from recallk.errors import InputError
from stages.params import load_section

#: prepare() params of these tests: every image is in val/gallery and, under leave_one_out, a query.
DEFAULTS = dict(data_root="data", csv=None, on_bad_image="error", strategy="per_class", protocol="leave_one_out",
                seed=0, fractions={"train": 0.0, "val": 0.5, "gallery": 0.5})


@pytest.fixture
def work(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # prepare() writes paths relative to the cwd
    return tmp_path


def build(**overrides):
    return prepare.prepare(**(DEFAULTS | overrides))


def make_images(root: Path, labels: dict[str, int]) -> None:
    """``n`` distinct PNGs per label folder: ``root/<label>/<i>.png``."""
    for j, (label, n) in enumerate(labels.items()):
        for i in range(n):
            save_image(root / label / f"{i}.png", seed=100 * j + i)


def manifest(root: Path, rows: list[str], header: str = "path,label") -> str:
    (root / "m.csv").write_text(header + "\n" + "".join(r + "\n" for r in rows), encoding="utf-8")
    return "m.csv"


# ================================================================ 1. the same file under two rows


@pytest.mark.parametrize("alias", ["a/./0.png", "a//0.png", "./a/0.png", "a/link.png"])
def test_same_file_under_two_paths_is_refused(work, alias):
    """`a/./0.png`, `a//0.png` or a symlink alias name the file `a/0.png` again: under leave_one_out the
    query would retrieve its own file. The path-once rule compares resolved real paths."""
    make_images(work / "data", {"a": 3, "b": 3})
    if alias == "a/link.png":
        (work / "data" / "a" / "link.png").symlink_to("0.png")
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)] + [f"{alias},a"]
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows))
    message = str(info.value)
    assert contract.PATH_ONCE_RULE in message
    assert "CSV line 2, path 'a/0.png'" in message and f"CSV line 8, path '{alias}'" in message


def test_symlink_alias_in_a_folder_scan_is_refused(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "zz.png").symlink_to("0.png")
    with pytest.raises(InputError) as info:
        build()
    message = str(info.value)
    assert contract.PATH_ONCE_RULE in message
    assert "path 'a/0.png'" in message and "path 'a/zz.png'" in message


@pytest.mark.parametrize("protocol, splits", [
    ("leave_one_out", None),                      # both copies land in gallery: each retrieves the other
    ("query_gallery", ("val", "gallery")),        # a query and its byte-identical copy in the gallery
    ("query_gallery", ("gallery", "gallery")),    # listed twice in the gallery: counted twice
])
def test_byte_identical_files_in_val_gallery_are_refused(work, protocol, splits):
    """Two files with the same sha256 under two image_ids in val/gallery are one image twice."""
    make_images(work / "data", {"a": 3, "b": 3})
    shutil.copy(work / "data" / "a" / "0.png", work / "data" / "a" / "copy.png")
    if splits is None:
        overrides = {}
        rows = None
    else:
        rows = [f"{lab}/{i}.png,{lab},{s}" for lab in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
        rows[0] = f"a/0.png,a,{splits[0]}"
        rows.append(f"a/copy.png,a,{splits[1]}")
        overrides = {"csv": manifest(work / "data", rows, header="path,label,split"), "strategy": "given"}
    with pytest.raises(InputError) as info:
        build(protocol=protocol, **overrides)
    message = str(info.value)
    assert contract.EVAL_ONCE_RULE in message
    assert "path 'a/0.png'" in message and "path 'a/copy.png'" in message


def test_byte_identical_files_in_train_only_are_fine(work):
    make_images(work / "data", {"a": 3, "b": 3, "c": 2})
    shutil.copy(work / "data" / "c" / "0.png", work / "data" / "c" / "copy.png")
    rows = ([f"{lab}/{i}.png,{lab},{s}" for lab in "ab" for i, s in enumerate(("val", "gallery", "gallery"))]
            + ["c/0.png,c,train", "c/1.png,c,train", "c/copy.png,c,train"])
    cat, _, _ = build(csv=manifest(work / "data", rows, header="path,label,split"), strategy="given")
    assert len(cat) == 9


def test_split_stage_refuses_a_self_retrieving_alias(project):
    """End to end: the stage exits 2 with one message instead of a leave_one_out recall@1 of 1.0."""
    root = project / "data" / "digits"
    rows = [f"{p.parent.name}/{p.name},{p.parent.name}" for p in sorted(root.glob("*/*.png"))]
    first = rows[0].split(",")[0]
    rows.append(first.replace("/", "/./") + "," + rows[0].split(",")[1])
    (root / "m.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    params = (project / "params.yaml").read_text()
    params = params.replace("csv: null", "csv: m.csv").replace("protocol: query_gallery", "protocol: leave_one_out")
    params = params.replace("strategy: class_disjoint", "strategy: per_class")
    (project / "params.yaml").write_text(params)
    proc = run_module("stages.split", cwd=project)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert contract.PATH_ONCE_RULE in proc.stderr
    assert not (project / "data" / "prepared" / "catalog.csv").exists()


# ================================================================ 4. a poisoned embedding cache


def poison(path: Path, fingerprint: str, vectors: dict[str, np.ndarray]) -> None:
    """Overwrite cache entries as another run (or a damaged shared cache) could have left them."""
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.executemany("INSERT OR REPLACE INTO embedding VALUES (?, ?, ?, ?)",
                       [(fingerprint, sha, v.size, np.asarray(v, "<f4").tobytes()) for sha, v in vectors.items()])


def pngs(folder: Path, n: int) -> pd.DataFrame:
    rows = []
    for i in range(n):
        path = save_image(folder / f"{i}.png", seed=i)
        rows.append({"image_id": f"id{i}", "path": str(path), "sha256": hashlib.sha256(path.read_bytes()).hexdigest()})
    return pd.DataFrame(rows)


BAD_VECTORS = {
    "nan": lambda dim: np.full(dim, np.nan),
    "inf": lambda dim: np.r_[np.inf, np.ones(dim - 1)],
    "zero": lambda dim: np.zeros(dim),
    "short": lambda dim: np.ones(dim - 1),
    "long": lambda dim: np.ones(dim + 7),
}


@pytest.mark.parametrize("kind", BAD_VECTORS)
def test_poisoned_cache_hits_are_encoded_again(tmp_path, kind, caplog):
    """NaN, inf, all-zero or wrong-dimension cache entries were served as they were (exit 0, a wrong
    embeddings.npy). They get the checks of fresh vectors: dropped, logged, encoded again, replaced."""
    backbone = get_backbone("pixels", {"resolution": 4})
    cat = pngs(tmp_path / "img", 5)
    fresh, _, _ = encode_catalog(cat, backbone, batch_size=2, num_workers=1)
    db = tmp_path / "c.sqlite"
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        encode_catalog(cat, backbone, batch_size=2, num_workers=1, cache=cache)
    poison(db, backbone.fingerprint, {cat["sha256"][1]: BAD_VECTORS[kind](backbone.dim),
                                      cat["sha256"][3]: BAD_VECTORS[kind](backbone.dim)})
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=2, num_workers=1, cache=cache)
        healed = cache.get_many(cat["sha256"])
    assert out.tobytes() == fresh.tobytes()
    assert (n_enc, n_hit) == (2, 3)
    assert "dropped 2 unusable cached embedding(s)" in caplog.text
    assert all(healed[sha].tobytes() == fresh[i].tobytes() for i, sha in enumerate(cat["sha256"]))


def test_cache_hits_of_a_callable_are_judged_by_a_fresh_vector(tmp_path, monkeypatch):
    """A user callable declares no dimension: every file cached with the wrong one used to come back
    as it was. One file is encoded again; its dimension judges the hits."""
    (tmp_path / "mod_integrity_mean.py").write_text(
        "import numpy as np\n"
        "def embed(images):\n    return np.array([np.asarray(i, float).mean((0, 1)) for i in images])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    backbone = get_backbone("callable:mod_integrity_mean:embed")
    cat = pngs(tmp_path / "img", 4)
    fresh, _, _ = encode_catalog(cat, backbone, batch_size=3, num_workers=1)
    db = tmp_path / "c.sqlite"
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        cache.put_many(cat["sha256"].tolist(), np.ones((4, 5), np.float32))  # every entry: dimension 5, not 3
    with EmbeddingCache(db, backbone.fingerprint) as cache:
        out, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=3, num_workers=1, cache=cache)
    assert out.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (4, 0)
    with EmbeddingCache(db, backbone.fingerprint) as cache:  # healed: now every file is served from the cache
        again, n_enc, n_hit = encode_catalog(cat, backbone, batch_size=3, num_workers=1, cache=cache)
    assert again.tobytes() == fresh.tobytes() and (n_enc, n_hit) == (1, 3)


def test_encode_stage_output_does_not_depend_on_a_poisoned_cache(project, tmp_path, monkeypatch):
    monkeypatch.setenv("RECALLK_CACHE_DIR", str(tmp_path / "cache"))
    assert run_module("stages.split", cwd=project).returncode == 0
    assert run_module("stages.encode", cwd=project).returncode == 0
    fresh = (project / "data/embeddings/embeddings.npy").read_bytes()
    cat = pd.read_csv(project / "data/prepared/catalog.csv", dtype=str)
    backbone = get_backbone("pixels", {"resolution": 16})
    poison(tmp_path / "cache" / "embeddings.sqlite", backbone.fingerprint,
           {cat["sha256"][0]: np.full(backbone.dim, np.nan), cat["sha256"][1]: np.zeros(backbone.dim)})
    proc = run_module("stages.encode", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "dropped 2 unusable cached embedding(s)" in proc.stderr
    assert "encoded 2 images, served 198 from the cache" in proc.stderr
    assert (project / "data/embeddings/embeddings.npy").read_bytes() == fresh


# ================================================================ 6. params.yaml: the stages read what DVC records


def params_text(**replace: str) -> str:
    """The committed params.yaml with whole lines replaced: ``params_text(**{"  seed: 0": "  seed: 010"})``."""
    text = (ROOT / "params.yaml").read_text(encoding="utf-8")
    for old, new in replace.items():
        assert old + "\n" in text, old
        text = text.replace(old + "\n", new + "\n", 1)
    return text


def test_committed_params_read_the_same_as_with_pyyaml():
    expected = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    for section in ("split", "encode", "score"):
        assert load_section(section, ROOT / "params.yaml") == expected[section]


@pytest.mark.parametrize("line, written, name, fix", [
    ("  seed: 0", "  seed: 010", "`split.seed` (line 7)", "write 10 or 8"),               # YAML 1.1 octal
    ("  seed: 0", "  seed: 0o10", "`split.seed` (line 7)", 'write 8 or "0o10"'),          # YAML 1.2 octal
    ("  on_bad_image: error", "  on_bad_image: off", "`split.on_bad_image`", 'write "off" or false'),
    ("  on_bad_image: error", "  on_bad_image: yes", "`split.on_bad_image`", 'write "yes" or true'),
    ("    resolution: 16", "    resolution: 1:04", "`encode.pixels.resolution`", 'write "1:04" or 64'),  # sexagesimal
    ("  max_memory_mb: 512", "  max_memory_mb: 5e2", "`score.max_memory_mb`", 'write 500.0 or "5e2"'),
    ("  ks: [1, 5, 10]", "  ks: [1, 5, 010]", "`score.ks[2]`", "write 10 or 8"),
])
def test_params_that_yaml_1_1_reads_differently_are_refused(tmp_path, line, written, name, fix):
    """`seed: 010` ran with seed 8 (PyYAML, YAML 1.1) while dvc.lock recorded 10 (DVC, YAML 1.2)."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{line: written}), encoding="utf-8")
    for section in ("split", "encode", "score"):  # every stage refuses it, not only the owner of the key
        with pytest.raises(InputError) as info:
            load_section(section, path)
        message = str(info.value)
        assert name in message and fix in message and "dvc.lock" in message


@pytest.mark.parametrize("line, twice, name", [
    ("  seed: 0", "  seed: 0\n  seed: 3", "`split.seed` is given twice (lines 7 and 8)"),
    ("score:", "split: {}\nscore:", "`split` is given twice (lines 1 and 27)"),  # score: on line 27 of params.yaml
    ("    train: 0.5", "    train: 0.5\n    train: 0.7", "`split.fractions.train` is given twice"),
])
def test_params_with_a_repeated_key_are_refused(tmp_path, line, twice, name):
    """The stages kept the last value (PyYAML); DVC refuses the file."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{line: twice}), encoding="utf-8")
    with pytest.raises(InputError, match="keep one of them") as info:
        load_section("split", path)
    assert name in str(info.value)


def test_params_values_are_read_as_dvc_reads_them(tmp_path):
    """Quoted text stays text, and a value both YAML versions agree on is taken as it is."""
    path = tmp_path / "params.yaml"
    path.write_text(params_text(**{"  on_bad_image: error": '  on_bad_image: "skip"', "  seed: 0": "  seed: 0x10"}))
    values = load_section("split", path)
    assert (values["on_bad_image"], values["seed"]) == ("skip", 16)


# ================================================================ 2. no folder drops out of a scan silently


def unreadable(monkeypatch, *folders: Path) -> None:
    """``os.scandir`` fails on ``folders`` as on a folder without read permission (the tests may run as root)."""
    real_scandir = os.scandir
    blocked = {os.path.abspath(f) for f in folders}

    def scandir(path="."):
        if os.path.abspath(path) in blocked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def test_unreadable_label_folder_and_sub_folder_are_named(work, monkeypatch):
    """os.walk dropped an unreadable folder without a word: its images vanished from the catalog."""
    make_images(work / "data", {"a": 3, "b": 3, "c": 3})
    save_image(work / "data" / "b" / "deep" / "x.png", seed=50)
    unreadable(monkeypatch, work / "data" / "a", work / "data" / "b" / "deep")
    with pytest.raises(InputError) as info:
        catalog.scan_folder(Path("data"))
    message = str(info.value)
    assert "2 folder(s) or link(s) cannot be scanned" in message
    assert "a/ cannot be read (Permission denied); fix its permissions" in message
    assert "b/deep/ cannot be read (Permission denied)" in message


def test_unreadable_data_root_is_an_input_error(work, monkeypatch):
    make_images(work / "data", {"a": 2})
    unreadable(monkeypatch, work / "data")
    with pytest.raises(InputError, match=r"data root 'data' cannot be read \(Permission denied\)"):
        catalog.scan_folder(Path("data"))


@pytest.mark.parametrize("link, target, named", [
    ("a/back", "..", "a/back/ is a symlink loop"),            # a folder link to its own parent
    ("a/deep/up", "../..", "a/deep/up/ is a symlink loop"),   # to the data root, from a sub-folder
    ("a/self.png", "self.png", "a/self.png is a symlink loop"),  # a file link to itself
    ("loop", "loop", "loop is a symlink loop"),               # a label "folder" that is a loop
])
def test_symlink_loops_are_named(work, link, target, named):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "deep").mkdir()
    (work / "data" / link).symlink_to(target)
    with pytest.raises(InputError, match="cannot be scanned") as info:
        catalog.scan_folder(Path("data"))
    assert named in str(info.value)


def test_linked_sub_folder_is_scanned_not_dropped(work):
    """A link to a folder inside a label folder was not followed (its images vanished); it is followed
    like a label folder that is a link, and the contract then judges its files."""
    make_images(work / "data", {"a": 3, "b": 3})
    save_image(work / "data" / ".store" / "x.png", seed=60)
    (work / "data" / "a" / "more").symlink_to("../.store", target_is_directory=True)
    assert "a/more/x.png" in catalog.scan_folder(Path("data"))["path"].tolist()


def test_split_stage_names_a_symlink_loop_without_a_traceback(project):
    (project / "data" / "digits" / "3" / "loop.png").symlink_to("loop.png")
    proc = run_module("stages.split", cwd=project)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "3/loop.png is a symlink loop" in proc.stderr


def test_manifest_row_naming_a_symlink_loop_is_a_contract_failure(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "loop.png").symlink_to("loop.png")
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)] + ["a/loop.png,a"]
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows))
    assert "CSV line 8, path 'a/loop.png', is a symlink loop; point the link at a file or remove it" in str(info.value)


# ================================================================ 3. a manifest DVC cannot see


@pytest.mark.parametrize("where", ["../elsewhere.csv", "ABSOLUTE", "link.csv", "sub/../../elsewhere.csv"])
def test_manifest_outside_the_data_root_is_refused(work, where):
    """DVC tracks only `split.data_root`: a manifest outside it could change without re-running the split."""
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    (work / "elsewhere.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    if where == "ABSOLUTE":
        where = str(work / "elsewhere.csv")
    if where == "link.csv":
        (work / "data" / "link.csv").symlink_to(work / "elsewhere.csv")
    with pytest.raises(InputError) as info:
        build(csv=where)
    message = str(info.value)
    assert f"`split.csv` is {where!r}, which is not inside `split.data_root` ('data')" in message
    assert "Move the manifest into 'data'" in message and "`split.csv: " in message


def test_manifest_in_a_sub_folder_of_the_data_root_is_fine(work):
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    (work / "data" / "lists").mkdir()
    (work / "data" / "lists" / "m.csv").write_text("path,label\n" + "\n".join(rows) + "\n")
    cat, _, _ = build(csv="lists/m.csv")
    assert len(cat) == 6


# ================================================================ 5. pixels of more than 8 bits


def tiff(array: np.ndarray, mode: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(array, mode).save(buf, "TIFF")
    return buf.getvalue()


def grey(img: Image.Image) -> np.ndarray:
    assert img.mode == "RGB"
    rgb = np.asarray(img)
    assert (rgb == rgb[..., :1]).all()
    return rgb[..., 0]


def test_float_image_in_0_1_is_scaled_not_black():
    """Mode F brightness 0..1 became levels 0 or 1 (black): it is scaled to 0..255."""
    values = np.linspace(0, 1, 16, dtype=np.float32).reshape(4, 4)
    assert Image.open(io.BytesIO(tiff(values, "F"))).mode == "F"
    np.testing.assert_array_equal(grey(images.decode(tiff(values, "F"))), np.rint(values * 255).astype(np.uint8))


def test_16_bit_levels_in_mode_i_keep_their_scale():
    levels = (np.arange(16, dtype=np.int32).reshape(4, 4) * 4369)  # 0 .. 65535
    np.testing.assert_array_equal(grey(images.decode(tiff(levels, "I"))), np.rint(levels / 257).astype(np.uint8))


@pytest.mark.parametrize("array, mode, why", [
    (np.array([[0, 70000], [100000, 2**31 - 1]], np.int32), "I",
     "32-bit integer pixels (mode I) span 0..2.14748e+09, beyond 16-bit levels 0..65535"),
    (np.array([[-5, 0], [10, 20]], np.int32), "I", "span -5..20, beyond 16-bit levels"),
    (np.array([[0.0, 0.5], [2.0, 255.0]], np.float32), "F", "floating-point pixels (mode F) span 0..255, beyond 0..1"),
    (np.array([[0.0, np.nan], [0.5, 1.0]], np.float32), "F", "include NaN or inf"),
])
def test_pixels_of_unknown_scale_are_refused(array, mode, why):
    """Mode I above 65535 was divided by 257 and clipped to white; mode F beyond 0..1 was clipped."""
    with pytest.raises(images.DECODE_ERRORS, match=re.escape(why)) as info:
        images.decode(tiff(array, mode))
    assert "save the image with 8 or 16 bits per channel" in str(info.value)


def test_split_stage_names_an_image_of_unknown_scale(work):
    make_images(work / "data", {"a": 3, "b": 3})
    (work / "data" / "a" / "wide.tif").write_bytes(tiff(np.array([[0, 70000]], np.int32), "I"))
    with pytest.raises(InputError) as info:
        build()
    assert ("path 'a/wide.tif', Pillow cannot decode it (32-bit integer pixels (mode I) span 0..70000, beyond "
            "16-bit levels 0..65535" in str(info.value))


# ================================================================ 7. quoted values are bounded


def test_quote_cuts_long_values_and_says_how_long():
    assert quote("abc") == "'abc'"
    long = quote("x" * 1000)
    assert long == "'" + "x" * 199 + "... (1002 characters in all)"
    assert quote(list(range(10)), limit=8) == "[0, 1, 2... (30 characters in all)"


def longest_line(message: str) -> int:
    return max(len(line) for line in message.splitlines())


@pytest.mark.parametrize("dotted, value", [
    ("split.strategy", "x" * 100_000),              # choice
    ("score.ks", list(range(-1, 2_000))),           # list rule from recallk.checks
    ("split.seed", "s" * 100_000),                  # integer rule from stages/params.py
    ("encode", ["not", "a", "mapping"] * 1_000),    # a section that is not a mapping
])
def test_params_messages_quote_values_within_bounds(tmp_path, dotted, value):
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    *parents, leaf = dotted.split(".")
    node = params
    for key in parents:
        node = node[key]
    node[leaf] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False, width=10**9), encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_section(dotted.split(".")[0] if "." in dotted else "split", path)
    message = str(info.value)
    assert f"`{dotted}`" in message and "characters in all)" in message
    assert longest_line(message) < 600, message[:1000]


def test_contract_rows_quote_cells_within_bounds(work):
    make_images(work / "data", {"a": 3, "b": 3})
    rows = [f"{lab}{i},{lab}/{i}.png,{lab}" for lab in "ab" for i in range(3)]
    rows += [f"id,{'p' * 50_000}.png,a", f"{'q' * 50_000}\x01,a/0.png,a"]  # a missing file; a bad id
    with pytest.raises(InputError) as info:
        build(csv=manifest(work / "data", rows, header="image_id,path,label"))
    message = str(info.value)
    assert "CSV line 8, path 'ppppp" in message and "CSV line 9, path 'a/0.png', image_id 'qqqq" in message
    assert message.count("characters in all)") >= 2
    assert longest_line(message) < 600, message[:1000]
