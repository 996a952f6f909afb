"""How wide is ``dvc exp show --only-changed`` after 16 experiments, and what leads ``dvc metrics diff``?

Copies the pipeline (stages, recallk, the DVC files, ``--per-label`` digits per label) into a temp git
repo, runs ``dvc repro``, then 16 experiments of the kinds people run (split seeds, pixel resolutions,
whitening, bootstrap seeds, batch sizes, a second copy of the data root, failure-gallery sizes), and
prints the column count of ``dvc exp show --only-changed --csv`` and its columns by kind (metrics per
file, params, deps), with and without ``metrics/intervals.json`` declared as a metrics file (without it:
those columns dropped, the table DVC prints once dvc.yaml no longer declares it), and the first rows of
``dvc metrics diff`` between two experiments.

Run from the project root (a few minutes; put the venv's bin first on PATH):

    python bench/exp_table_columns.py [--per-label 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = (".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore", "dvc.yaml", "params.yaml")
EXPERIMENTS = [
    *([f"split.seed={s}"] for s in (1, 2, 3, 4)),
    *([f"encode.pixels.resolution={r}"] for r in (8, 12, 20, 24)),
    ["score.whiten=pca"],
    *([f"score.bootstrap.seed={s}"] for s in (1, 2)),
    *([f"encode.batch_size={b}"] for b in (32, 128)),
    ["split.data_root=data/digits_copy"],
    *([f"score.failures.queries={q}"] for q in (4, 12)),
]


def sh(*args: str, cwd: Path) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def copy_project(dest: Path, per_label: int) -> None:
    for package in ("stages", "recallk"):
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for rel in FILES:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel)
    for label_dir in sorted((ROOT / "data" / "digits").iterdir()):
        if label_dir.is_dir():
            for root in ("digits", "digits_copy"):
                (dest / "data" / root / label_dir.name).mkdir(parents=True)
                for image in sorted(label_dir.iterdir())[:per_label]:
                    shutil.copy2(image, dest / "data" / root / label_dir.name / image.name)


def kinds(columns: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for column in columns:
        kind = column.split(":", 1)[0] if ":" in column else "other"
        out[kind] = out.get(kind, 0) + 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-label", type=int, default=20)
    p.add_argument("--keep", help="build the repo here and keep it (default: a temp dir, removed)")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="exp_columns_"))
    repo = work / "repo"
    copy_project(repo, args.per_label)
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    sh("dvc", "repro", "-q", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "commit", "-qm", "base", cwd=repo)
    for i, changes in enumerate(EXPERIMENTS):
        sh("dvc", "exp", "run", "-q", "-n", f"e{i:02d}", *(x for c in changes for x in ("-S", c)), cwd=repo)
    table = sh("dvc", "exp", "show", "--only-changed", "--csv", "--no-pager", cwd=repo)
    header = next(csv.reader(io.StringIO(table)))
    without = [c for c in header if not c.startswith("metrics/intervals.json:")]
    print(f"{len(EXPERIMENTS)} experiments, {args.per_label} digits per label")
    print(f"dvc exp show --only-changed: {len(header)} columns with metrics/intervals.json declared {kinds(header)}")
    print(f"  without it: {len(without)} columns {kinds(without)}")
    print("  columns: " + ", ".join(without))
    refs = dict(line.split()[::-1] for line in sh("git", "for-each-ref", "--format=%(objectname) %(refname)",
                                                   "refs/exps", cwd=repo).splitlines())
    shas = {ref.rsplit("/", 1)[-1]: sha for ref, sha in refs.items()}
    diff = sh("dvc", "metrics", "diff", shas["e00"], shas["e05"], cwd=repo)
    print("dvc metrics diff e00 e05 (first 14 lines):\n" + "\n".join(diff.splitlines()[:14]))
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
