"""How wide is ``dvc exp show --only-changed`` after 16 experiments, and what leads ``dvc metrics diff``?

Copies the pipeline (stages, recallk, the DVC files, ``--per-label`` digits per label) into a temp git
repo, runs ``dvc repro``, then 16 experiments of the kinds people run (split seeds, pixel resolutions,
whitening, bootstrap seeds, batch sizes, a second copy of the data root, failure-gallery sizes), and
prints the column count of ``dvc exp show --only-changed`` and its columns by kind (intervals, counts,
headline metrics, params, deps), without the dependency hashes too (``--drop``), and the first rows of
``dvc metrics diff`` between two experiments. The pipeline declares one metrics file, metrics/recall.json
(the means); the counts (metrics/counts.json) and the intervals (metrics/intervals.json) are not declared.
The encode and score stages write one folder out each (data/embeddings, data/scores): one dependency-hash
column each.

Run from the project root (a few minutes; put the venv's bin first on PATH):

    python bench/exp_table_columns.py [--per-label 20] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import re
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


#: The interval and class-mean keys (metrics/intervals.json).
INTERVAL_COLUMNS = ".*_ci_(low|high)|.*_class_mean"
#: The dependency-hash columns (each changed dep path; `--drop` hides them).
DEP_COLUMNS = ".*/.*"
#: The counts' keys (metrics/counts.json; in metrics/recall.json before issue 24).
COUNTS = re.compile(r"num_|embedding_dim|tie_sensitive|near_duplicates")


def columns(markdown: str) -> list[str]:
    """The column names of ``dvc exp show --md`` (its first line)."""
    return [c.strip() for c in markdown.splitlines()[0].strip().strip("|").split("|")]


def kinds(header: list[str], headline: set[str]) -> dict[str, int]:
    """The columns counted by kind: intervals, counts, headline metrics (the keys of ``headline``), params, deps,
    the first two, and ``other`` (a value of another params file, such as a params dep on a key of a JSON out,
    shown by its bare key)."""
    out = {"intervals": 0, "counts": 0, "headline": 0, "params": 0, "deps": 0, "experiment/created": 0, "other": 0}
    for column in header:
        kind = ("experiment/created" if column in ("Experiment", "Created") else
                "deps" if "/" in column else "headline" if column in headline else
                "params" if "." in column.split("@")[0] and not column.endswith(("_low", "_high", "_mean")) else
                "intervals" if re.fullmatch(INTERVAL_COLUMNS, column) else
                "counts" if COUNTS.match(column) else "other")
        out[kind] += 1
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-label", type=int, default=20)
    p.add_argument("--keep", help="build the repo here and keep it (default: a temp dir, removed)")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="exp_columns_"))
    repo = work / "repo"
    if not (repo / ".git").is_dir():  # an earlier --keep run's repo is reused as it is
        copy_project(repo, args.per_label)
        sh("git", "init", "-q", "-b", "main", cwd=repo)
        sh("dvc", "repro", "-q", cwd=repo)
        sh("git", "add", "-A", cwd=repo)
        sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "commit", "-qm", "base", cwd=repo)
        for i, changes in enumerate(EXPERIMENTS):
            sh("dvc", "exp", "run", "-q", "-n", f"e{i:02d}", *(x for c in changes for x in ("-S", c)), cwd=repo)
    shown_metrics = json.loads(sh("dvc", "metrics", "show", "--json", cwd=repo) or "{}")  # {"": {"data": {...}}}
    declared = sorted(next(iter(shown_metrics.values()), {}).get("data", {}))
    print(f"{len(EXPERIMENTS)} experiments, {args.per_label} digits per label; declared metrics files: "
          f"{', '.join(declared)}")
    headline = set(json.loads((repo / "metrics" / "recall.json").read_text(encoding="utf-8")))
    shown = {}
    for title, extra in (("", []), (", dependency hashes dropped", ["--drop", DEP_COLUMNS])):
        shown[title] = columns(sh("dvc", "exp", "show", "--only-changed", "--md", "--no-pager", *extra, cwd=repo))
        print(f"dvc exp show --only-changed{title}: {len(shown[title])} columns {kinds(shown[title], headline)}")
    print("  columns: " + ", ".join(shown[""]))
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
