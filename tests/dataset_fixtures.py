"""Small fixture trees in each benchmark's official file format (the real file names and line formats, a
few classes, real JPEG files through Pillow; Karpathy's split files for the caption benchmarks), for
``recallk datasets prepare`` (importable beside helpers).

Each ``write_<name>(root)`` builds the tree under ``root`` and returns the counts ``prepare`` must measure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from helpers import save_image

SIZE = (16, 16)


class Seeds:
    """Distinct seeds, so no two fixture images are byte-identical (the split refuses copies in val/gallery)."""

    def __init__(self, start: int = 0) -> None:
        self.next = start

    def __call__(self) -> int:
        self.next += 1
        return self.next


def jpg(path: Path, seeds: Seeds) -> None:
    save_image(path, seed=seeds(), size=SIZE, fmt="JPEG")


def write_cub(root: Path, classes=(1, 2, 101, 102, 103), per_class: int = 3) -> dict[str, int]:
    """CUB_200_2011: images.txt, image_class_labels.txt, train_test_split.txt (unused), images/<NNN.Name>/."""
    seeds, images, labels, split = Seeds(100), [], [], []
    for c in classes:
        folder = f"{c:03d}.Bird_{c}"
        for k in range(per_class):
            rel = f"{folder}/Bird_{c}_{k:04d}_{c * 10 + k}.jpg"
            jpg(root / "images" / rel, seeds)
            n = len(images) + 1
            images.append(f"{n} {rel}")
            labels.append(f"{n} {c}")
            split.append(f"{n} {int(k % 2 == 0)}")
    for name, lines in (("images.txt", images), ("image_class_labels.txt", labels),
                        ("train_test_split.txt", split)):
        (root / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    test = sum(per_class for c in classes if c > 100)
    return {"images": len(images), "train": len(images) - test, "test": test, "classes": len(classes)}


def write_cars_mat(root: Path, classes=(1, 2, 99, 100), per_class: int = 3) -> dict[str, int]:
    """Stanford Cars: cars_annos.mat (struct `annotations`: relative_im_path, bbox_*, class, test) + car_ims/."""
    from scipy.io import savemat

    seeds, rows = Seeds(300), []
    for c in classes:
        for _ in range(per_class):
            rel = f"car_ims/{len(rows) + 1:06d}.jpg"
            jpg(root / rel, seeds)
            rows.append((rel, 1, 1, 15, 15, c, len(rows) % 2))
    fields = ["relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test"]
    annos = np.zeros((1, len(rows)), dtype=[(f, "O") for f in fields])
    for i, row in enumerate(rows):
        for f, v in zip(fields, row):
            annos[0, i][f] = np.array([[v]]) if not isinstance(v, str) else v
    savemat(root / "cars_annos.mat", {"annotations": annos, "class_names": np.array([f"Car {c}" for c in classes],
                                                                                    dtype=object)})
    return _cars_counts(rows, classes, per_class)


def _cars_counts(rows, classes, per_class) -> dict[str, int]:
    test = sum(per_class for c in classes if c > 98)
    return {"images": len(rows), "train": len(rows) - test, "test": test, "classes": len(classes)}


def write_cars_folders(root: Path, classes=(1, 2, 99, 100), per_class: int = 2) -> dict[str, int]:
    """The folder re-packaging: names.csv (class names in class order) + car_data/{train,test}/<name>/."""
    seeds, rows = Seeds(400), []
    names = [f"Car Model {i} 2012" for i in range(1, max(classes) + 1)]
    (root / "names.csv").write_text("\n".join(names) + "\n", encoding="utf-8")
    for c in classes:
        for k in range(per_class):
            part = "train" if k % 2 == 0 else "test"  # the classification split: ignored by the protocol
            jpg(root / "car_data" / part / names[c - 1] / f"{c:03d}{k:02d}.jpg", seeds)
            rows.append(c)
    (root / "car_data" / "test").mkdir(parents=True, exist_ok=True)
    return _cars_counts(rows, classes, per_class)


def write_sop(root: Path) -> dict[str, int]:
    """Stanford_Online_Products: Ebay_train.txt / Ebay_test.txt (header + `image_id class_id super_class_id
    path`), <super>_final/<class>_<k>.JPG."""
    seeds, counts, image_id = Seeds(500), {}, 0
    for name, classes in (("train", [(1, 1), (2, 1), (3, 2)]), ("test", [(4, 1), (5, 2), (6, 2)])):
        lines = ["image_id class_id super_class_id path"]
        for class_id, sup in classes:
            folder = ("bicycle_final", "cabinet_final")[sup - 1]
            for k in range(2):
                image_id += 1
                rel = f"{folder}/11108512{class_id:04d}_{k}.JPG"
                jpg(root / rel, seeds)
                lines.append(f"{image_id} {class_id} {sup} {rel}")
        (root / f"Ebay_{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        counts[name], counts[f"{name}_classes"] = len(lines) - 1, len(classes)
    return counts


def write_inshop(root: Path) -> dict[str, int]:
    """In-shop: list_eval_partition.txt (count, header, `image_name item_id evaluation_status`) + img/..."""
    seeds, rows = Seeds(600), []
    plan = [(1, "train"), (1, "train"), (2, "train"), (2, "train"),
            (3, "query"), (3, "gallery"), (3, "gallery"), (4, "query"), (4, "gallery"), (5, "gallery")]
    for k, (item, status) in enumerate(plan):
        rel = f"img/WOMEN/Dresses/id_{item:08d}/{k:02d}_1_front.jpg"
        jpg(root / rel, seeds)
        rows.append(f"{rel}  id_{item:08d}  {status}")
    text = "\n".join([str(len(rows)), "image_name item_id evaluation_status", *rows]) + "\n"
    (root / "list_eval_partition.txt").write_text(text, encoding="utf-8")
    return {"train": 4, "query": 2, "gallery": 4, "train_items": 2, "test_items": 3}


#: Market-1501 fixture: (person id, camera) of each file per folder; 0 = distractor, -1 = junk. Person 6's
#: query has gallery images under its own camera only: no valid match (the protocol skips it).
REID_PLAN = {
    "bounding_box_train": [(7, 1), (7, 2), (8, 1), (8, 3), (9, 2), (9, 3)],
    "query": [(1, 1), (2, 2), (3, 1), (4, 3), (5, 2), (6, 1)],
    "bounding_box_test": [(1, 1), (1, 2), (1, 3), (2, 1), (2, 2), (3, 2), (3, 3), (3, 1), (4, 1), (4, 3),
                          (5, 1), (5, 3), (6, 1), (6, 1), (0, 1), (0, 2), (0, 3), (-1, 1), (-1, 2), (-1, 3)],
}


def write_reid(root: Path, style: str = "market") -> dict[str, int]:
    """bounding_box_train/, query/, bounding_box_test/ named `<pid>_c<cam>s1_<frame>_<k>.jpg` (Market) or
    `<pid>_c<cam>_f<frame>.jpg` (Duke); a Thumbs.db in one folder (ignored)."""
    seeds = Seeds(700)
    for folder, files in REID_PLAN.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for k, (pid, cam) in enumerate(files):
            person = "-1" if pid == -1 else f"{pid:04d}"
            name = f"{person}_c{cam}s1_{k * 25:06d}_0{k % 7}.jpg" if style == "market" else \
                f"{person}_c{cam}_f{k:07d}.jpg"
            jpg(root / folder / name, seeds)
    (root / "bounding_box_test" / "Thumbs.db").write_bytes(b"\0")
    gallery = REID_PLAN["bounding_box_test"]
    return {"train": 6, "query": 6, "gallery": len(gallery), "gallery_junk": sum(p == -1 for p, _ in gallery),
            "train_ids": 3, "query_ids": 6}


def _sentence(image: int, k: int, text: str) -> dict:
    """One sentence of a Karpathy split file (``raw`` is the caption; ``tokens`` as the file gives them)."""
    return {"tokens": text.lower().strip(" .\n").split(), "raw": text, "imgid": image, "sentid": image * 10 + k}


def write_karpathy(root: Path, dataset: str, plan: list[tuple[str, int]], size: tuple[int, int] = SIZE
                   ) -> dict[str, int]:
    """Karpathy's split file (``dataset_flickr30k.json`` or ``dataset_coco.json``: ``{"images": [{"filename",
    "filepath" (coco), "split", "imgid", "sentids", "sentences": [{"tokens", "raw", "imgid", "sentid"}],
    "cocoid" (coco)}], "dataset"}``) and its images (``flickr30k-images/<id>.jpg``; COCO ``train2014/`` for
    train images, ``val2014/`` for the others, as Karpathy's val, restval and test come from val2014), one entry
    per ``(split, number of captions)`` of ``plan``, in order. Every caption is distinct; the second caption of
    each image ends in a line break and spaces, as some of the release's ``raw`` texts do. Returns the counts
    ``prepare`` must measure."""
    seeds, images = Seeds(900), []
    for n, (split, n_captions) in enumerate(plan):
        captions = [f"Photo {n} shows scene {k} of the {split} split." for k in range(n_captions)]
        if n_captions > 1:
            captions[1] += " \n "
        entry = {"sentids": [n * 10 + k for k in range(n_captions)], "imgid": n, "split": split,
                 "sentences": [_sentence(n, k, c) for k, c in enumerate(captions)]}
        if dataset == "coco":
            folder = "train2014" if split == "train" else "val2014"
            entry.update(filepath=folder, filename=f"COCO_{folder}_{100000 + n:012d}.jpg", cocoid=100000 + n)
            rel = f"{folder}/{entry['filename']}"
        else:
            entry["filename"] = f"{1000000000 + n}.jpg"
            rel = f"flickr30k-images/{entry['filename']}"
        save_image(root / rel, seed=seeds(), size=size, fmt="JPEG")
        images.append(entry)
    (root / f"dataset_{dataset}.json").write_text(json.dumps({"images": images, "dataset": dataset}),
                                                  encoding="utf-8")
    splits = [split for split, _ in plan]
    counts = {"images": len(plan), **{s: splits.count(s) for s in ("train", "val", "restval", "test")}}
    if dataset != "coco":
        del counts["restval"]
    counts["test_captions"] = sum(n for split, n in plan if split == "test")
    return counts


#: A small Flickr30k: 4 train, 2 val and 3 test images, five captions each.
FLICKR_PLAN = [("train", 5)] * 4 + [("val", 5)] * 2 + [("test", 5)] * 3
#: A small COCO: train, restval, val and test images; test images with 5, 6 and 7 captions.
COCO_PLAN = [("train", 5), ("restval", 5), ("train", 5), ("val", 5), ("restval", 5), ("test", 5), ("test", 6),
             ("val", 5), ("test", 7), ("test", 5)]
#: The 6- and 7-caption images among the 5,000 test images of :func:`write_coco_test`: 8 images with 6 and one
#: with 7 give 25,010 captions, as Karpathy's COCO test split; fold N is test images 1,000(N-1) to 1,000N - 1.
COCO_EXTRA = {100: 6, 1200: 6, 2300: 6, 2999: 7, 3400: 6, 4500: 6, 4600: 6, 4700: 6, 4800: 6}
#: The captions of each COCO 1K fold of :func:`write_coco_test`.
COCO_FOLD_CAPTIONS = {1: 5001, 2: 5001, 3: 5003, 4: 5001, 5: 5004}


def write_flickr30k(root: Path) -> dict[str, int]:
    return write_karpathy(root, "flickr30k", FLICKR_PLAN)


def write_coco(root: Path) -> dict[str, int]:
    return write_karpathy(root, "coco", COCO_PLAN)


def write_coco_test(root: Path) -> dict[str, int]:
    """COCO with Karpathy's whole test split (5,000 images, 25,010 captions: :data:`COCO_EXTRA`) and one image
    of each other split; 4x4 images, to stay quick."""
    plan = [("train", 5), ("restval", 5), ("val", 5)] + [("test", COCO_EXTRA.get(n, 5)) for n in range(5000)]
    return write_karpathy(root, "coco", plan, size=(4, 4))


#: A project's params file for ``--apply`` (comments that must survive; no ``split.captions``, which ``--apply``
#: adds at the section's end).
PARAMS = """# the project's params (comments must survive --apply)
split:
  data_root: data/digits  # where the images are
  csv: null
  strategy: class_disjoint
  protocol: query_gallery
  images: auto
score:
  ks: [1, 5, 10]
  exclude_same: []
  exclude_same_all: []
  junk: null  # off
"""


WRITERS = {"cub200": write_cub, "cars196": write_cars_mat, "sop": write_sop, "inshop": write_inshop,
           "market1501": write_reid, "dukemtmc": lambda root: write_reid(root, "duke")}


# ------------------------------------------------------------------------------ damaging a fixture tree


def set_line(path: Path, number: int, text: str | None) -> None:
    """Replace line ``number`` (from 1) of a release's list file with ``text``, or drop it (``None``)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[number - 1:number] = [] if text is None else [text]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def add_line(path: Path, text: str) -> None:
    """Append a line to a release's list file."""
    path.write_text(path.read_text(encoding="utf-8") + text + "\n", encoding="utf-8")


def rename_first(folder: Path, prefix: str, new_prefix: str) -> str:
    """Rename the first file of ``folder`` whose name starts with ``prefix`` to start with ``new_prefix``
    (a re-ID file's person id or camera written another way); return the new name."""
    old = next(p for p in sorted(folder.iterdir()) if p.name.startswith(prefix))
    new = new_prefix + old.name[len(prefix):]
    old.rename(folder / new)
    return new
