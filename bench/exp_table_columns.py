"""How wide is ``dvc exp show --only-changed`` after 16 experiments, and what leads ``dvc metrics diff``?

Copies the pipeline (stages, recallk, the DVC files, ``--per-label`` digits per label, a tiny numpy backbone
``encoders/tiny.py``) into a temp git repo, runs ``dvc repro``, then 16 experiments of the kinds people run
(split seeds, pixel resolutions, whitening, bootstrap seeds, a batch size, a second copy of the data root,
failure-gallery sizes, a second backbone (``callable:encoders.tiny:gray``), and four index runs: ``Flat``,
``IVF4,Flat`` with an nprobe sweep, ``HNSW8`` with an efSearch sweep, ``Flat`` beside a split seed), and
prints the column count of ``dvc exp show --only-changed`` and its columns by kind (intervals, counts,
headline metrics, other means, params, deps), without the dependency hashes too (``--drop``), and the first
rows of ``dvc metrics diff`` between two experiments. The pipeline declares one metrics file,
metrics/recall.json (recall@K's means); the counts (metrics/counts.json) and the other metrics' means with
every interval (metrics/intervals.json) are not declared. The encode and score stages write one folder out each
(data/embeddings, data/scores): one dependency-hash column each. Last, a toy repo shows why recall@K is not a
second declared file beside the other means: DVC prints the files of a diff in no fixed order.

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
    *([f"split.seed={s}"] for s in (1, 2)),
    *([f"encode.pixels.resolution={r}"] for r in (8, 12, 24)),
    ["score.whiten=pca"],
    ["score.bootstrap.seed=1"],
    ["encode.batch_size=32"],
    ["split.data_root=data/digits_copy"],
    *([f"score.failures.queries={q}"] for q in (4, 12)),
    # a second backbone: a numpy callable (its module folder is a dep of encode, by encode.callable.module_file)
    ["encode.backbone=callable:encoders.tiny:gray", "encode.callable.module_file=encoders"],
    # index runs (faiss): the index stage's params and its outs (metrics/index.json, the metrics/index folder)
    ["index.kinds=[Flat]"],
    ['index.kinds=["IVF4,Flat"]', "index.sweep.nprobe=[1,2]"],
    ["index.kinds=[HNSW8]", "index.sweep.efSearch=[16,64]"],
    ["index.kinds=[Flat]", "split.seed=3"],
]
#: The second backbone's module (a committed folder, as a `callable:` backbone needs).
TINY = '''import numpy as np


def gray(images):
    """8 x 8 grey levels."""
    return np.asarray([np.asarray(i.convert("L").resize((8, 8)), dtype=np.float32).ravel() / 255 for i in images])
'''


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
    (dest / "encoders").mkdir()
    (dest / "encoders" / "__init__.py").write_text("")
    (dest / "encoders" / "tiny.py").write_text(TINY)
    for label_dir in sorted((ROOT / "data" / "digits").iterdir()):
        if label_dir.is_dir():
            for root in ("digits", "digits_copy"):
                (dest / "data" / root / label_dir.name).mkdir(parents=True)
                for image in sorted(label_dir.iterdir())[:per_label]:
                    shutil.copy2(image, dest / "data" / root / label_dir.name / image.name)


#: The limit the table is held to (issue 38).
LIMIT = 25
#: The interval and class-mean keys (metrics/intervals.json, after the other metrics' means).
INTERVAL_COLUMNS = ".*_ci_(low|high)|.*_class_mean"
#: The dependency-hash columns (each changed dep path; `--drop` hides them).
DEP_COLUMNS = ".*/.*"
#: The counts' keys (metrics/counts.json; in metrics/recall.json before issue 24).
COUNTS = re.compile(r"num_|embedding_dim|tie_sensitive|near_duplicates")


def columns(markdown: str) -> list[str]:
    """The column names of ``dvc exp show --md`` (its first line)."""
    return [c.strip() for c in markdown.splitlines()[0].strip().strip("|").split("|")]


def kinds(header: list[str], headline: set[str], repo: Path | None = None,
          means: frozenset[str] = frozenset()) -> dict[str, int]:
    """The columns counted by kind: intervals, counts, headline metrics (the keys of ``headline``), the other
    metrics' means (``means``), params, deps (a path, or a top-level folder of ``repo`` such as ``encoders``), the
    first two, and ``other`` (a value of another params file, such as a params dep on a key of a JSON out, shown by
    its bare key)."""
    out = {"intervals": 0, "counts": 0, "headline": 0, "other means": 0, "params": 0, "deps": 0,
           "experiment/created": 0, "other": 0}
    for column in header:
        kind = ("experiment/created" if column in ("Experiment", "Created") else
                "deps" if "/" in column or repo is not None and (repo / column).is_dir() else
                "headline" if column in headline else
                "other means" if column in means else
                "params" if "." in column.split("@")[0] and not column.endswith(("_low", "_high", "_mean")) else
                "intervals" if re.fullmatch(INTERVAL_COLUMNS, column) else
                "counts" if COUNTS.match(column) else "other")
        out[kind] += 1
    return out


def metrics_diff_order(toy: Path, means: dict[str, float]) -> str:
    """What leads ``dvc metrics diff`` with every mean declared: a toy repo (git and DVC, no stages) with two
    committed versions of a metrics/recall.json holding ``means`` (every metric's mean of the real run; its values,
    and each one 0.01 lower), declared after a file holding recall@K only (metrics/recall_headline.json, its keys in
    reverse order), so the output shows DVC's order of files (declaration or name) and of keys (the file's or
    sorted)."""
    shutil.rmtree(toy, ignore_errors=True)
    toy.mkdir(parents=True)
    sh("git", "init", "-q", "-b", "main", cwd=toy)
    sh("dvc", "init", "-q", cwd=toy)
    (toy / "dvc.yaml").write_text("metrics:\n  - metrics/recall_headline.json\n  - metrics/recall.json\n")
    (toy / "metrics").mkdir()
    for step, delta in enumerate((0.0, 0.01)):
        values = {key: round(value - delta, 5) for key, value in means.items()}
        headline = {key: values[key] for key in sorted((k for k in values if k.startswith("recall@")),
                                                       key=lambda k: -int(k.split("@")[1]))}
        (toy / "metrics" / "recall_headline.json").write_text(json.dumps(headline, indent=2))
        (toy / "metrics" / "recall.json").write_text(json.dumps(values, indent=2))
        sh("git", "add", "-A", cwd=toy)
        sh("git", "-c", "user.name=bench", "-c", "user.email=bench@example.org", "commit", "-qm", f"v{step}",
           cwd=toy)
    diff = sh("dvc", "metrics", "diff", "HEAD~1", "HEAD", cwd=toy)
    orders = [" then ".join(dict.fromkeys(line.split()[0] for line in sh("dvc", "metrics", "diff", "HEAD~1", "HEAD",
                                                                         cwd=toy).splitlines()[1:]))
              for _ in range(6)]
    return ("dvc metrics diff HEAD~1 HEAD in a toy repo declaring metrics/recall_headline.json (keys written "
            f"{', '.join(headline)}) before metrics/recall.json (keys written {', '.join(values)}):\n" + diff
            + "file order of 6 more runs of the same `dvc metrics diff` (DVC 3.67 gathers the paths in a Python set, "
            "dvc/utils/diff.py, so the order changes with each process's string hash seed):\n  "
            + "\n  ".join(orders))


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
            # each experiment on the committed params: a workspace `dvc exp run` leaves its changes in params.yaml
            sh("git", "checkout", "-q", "--", "params.yaml", cwd=repo)
            sh("dvc", "exp", "run", "-q", "-n", f"e{i:02d}", *(x for c in changes for x in ("-S", c)), cwd=repo)
    shown_metrics = json.loads(sh("dvc", "metrics", "show", "--json", cwd=repo) or "{}")  # {"": {"data": {...}}}
    declared = sorted(next(iter(shown_metrics.values()), {}).get("data", {}))
    print(f"{len(EXPERIMENTS)} experiments, {args.per_label} digits per label; declared metrics files: "
          f"{', '.join(declared)}")
    declared_means = json.loads((repo / "metrics" / "recall.json").read_text(encoding="utf-8"))
    intervals = repo / "metrics" / "intervals.json"
    detail = json.loads(intervals.read_text(encoding="utf-8")) if intervals.is_file() else {}
    other_means = {k: v for k, v in detail.items() if not re.fullmatch(INTERVAL_COLUMNS, k)}
    shown = {}
    for title, extra in (("", []), (", dependency hashes dropped", ["--drop", DEP_COLUMNS])):
        shown[title] = columns(sh("dvc", "exp", "show", "--only-changed", "--md", "--no-pager", *extra, cwd=repo))
        by_kind = kinds(shown[title], set(declared_means), repo, frozenset(other_means))
        print(f"dvc exp show --only-changed{title}: {len(shown[title])} columns "
              f"({'within' if len(shown[title]) <= LIMIT else 'over'} {LIMIT}) {by_kind}")
    print("  columns: " + ", ".join(shown[""]))
    refs = dict(line.split()[::-1] for line in sh("git", "for-each-ref", "--format=%(objectname) %(refname)",
                                                   "refs/exps", cwd=repo).splitlines())
    shas = {ref.rsplit("/", 1)[-1]: sha for ref, sha in refs.items()}
    diff = sh("dvc", "metrics", "diff", shas["e00"], shas["e02"], cwd=repo)
    print("dvc metrics diff e00 e02 (first 14 lines):\n" + "\n".join(diff.splitlines()[:14]))
    diff = sh("dvc", "metrics", "diff", shas["e00"], shas["e02"], "--targets", "metrics/intervals.json", cwd=repo)
    print("dvc metrics diff --targets metrics/intervals.json e00 e02 (first 8 lines):\n"
          + "\n".join(diff.splitlines()[:8]))
    print(metrics_diff_order(work / "order", {**declared_means, **other_means}))
    if not args.keep:
        shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
