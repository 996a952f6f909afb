"""Embeddings-only benchmark: the whole pipeline on a manifest of ids and precomputed embeddings, no image.

In a temporary git repository holding the project's pipeline (stages, library, dvc.yaml, params.yaml),
it writes a manifest ``image_id,label`` of ``--ids`` ids (``--labels`` labels) and an ``.npz`` of
seeded clustered embeddings (``--dim``), sets ``encode.backbone: precomputed``, then times with real DVC:

* each stage on its own (``dvc repro --single-item <stage>``: the stage plus DVC's hashing and lock);
* a second ``dvc repro`` after the embeddings file is overwritten in place (encode and score re-run,
  split is skipped);
* a third, with nothing to do.

Run from the project root, with dvc on PATH (the project's environment):

    python bench/embeddings_only_bench.py [--ids 50000] [--labels 500] [--dim 128] [--keep]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
FILES = ("dvc.yaml", "params.yaml", ".dvc/config", ".dvc/.gitignore", ".dvcignore", ".gitignore")


def run(args: list[str], cwd: Path) -> tuple[float, str]:
    env = dict(os.environ, DVC_NO_ANALYTICS="1", RECALLK_NO_REPORT="1", GIT_AUTHOR_NAME="bench",
               GIT_AUTHOR_EMAIL="bench@example.com", GIT_COMMITTER_NAME="bench",
               GIT_COMMITTER_EMAIL="bench@example.com",
               PYTHONPATH=os.pathsep.join(filter(None, [str(cwd), os.environ.get("PYTHONPATH")])))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    start = time.perf_counter()
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode:
        sys.exit(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return took, proc.stdout + proc.stderr


def embeddings(n: int, labels: np.ndarray, dim: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(labels.max() + 1, dim)).astype(np.float32)
    emb = centres[labels] + 1.6 * rng.normal(size=(n, dim)).astype(np.float32)
    return {"ids": np.array([f"item{i:06d}" for i in range(n)]), "embeddings": emb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=50_000)
    parser.add_argument("--labels", type=int, default=500)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--keep", action="store_true", help="keep the temporary repository (its path is printed)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="recallk-emb-only-"))
    repo = work / "repo"
    try:
        repo.mkdir()
        for package in ("stages", "recallk"):
            shutil.copytree(ROOT / package, repo / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        for rel in FILES:
            (repo / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, repo / rel)
        params = yaml.safe_load((repo / "params.yaml").read_text())
        params["split"].update(data_root="data/ids", csv="manifest.csv")
        params["encode"]["backbone"] = "precomputed"
        params["encode"]["precomputed"]["path"] = "embeddings/emb.npz"
        (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        labels = np.random.default_rng(0).integers(0, args.labels, size=args.ids)
        data = embeddings(args.ids, labels, args.dim, seed=0)
        (repo / "data/ids").mkdir(parents=True)
        with open(repo / "data/ids/manifest.csv", "w", encoding="utf-8") as fh:
            fh.write("image_id,label\n")
            fh.writelines(f"{i},c{lab}\n" for i, lab in zip(data["ids"], labels))
        (repo / "embeddings").mkdir()
        np.savez(repo / "embeddings/emb.npz", **data)
        run(["git", "init", "-q", "-b", "main"], repo)
        run(["git", "add", "-A"], repo)
        run(["git", "commit", "-qm", "bench"], repo)
        print(f"{args.ids:,} ids, {args.labels} labels, {args.dim}-d precomputed embeddings "
              f"({(repo / 'embeddings/emb.npz').stat().st_size / 2**20:.1f} MB .npz); default params otherwise")
        total = 0.0
        for stage in ("split", "encode", "score"):
            took, _ = run([sys.executable, "-m", "dvc", "repro", "--single-item", stage], repo)
            total += took
            print(f"  dvc repro --single-item {stage:<6} {took:6.1f} s")
        print(f"  all three                       {total:6.1f} s")
        _, out = run([sys.executable, "-m", "stages.score", "--show"], repo)
        shown = [line.strip() for line in out.splitlines() if re.match(r"\s+(num queries|num gallery|recall@1:)", line)]
        print("  " + "; ".join(shown))
        np.savez(repo / "embeddings/emb.npz", **embeddings(args.ids, labels, args.dim, seed=1))
        took, out = run([sys.executable, "-m", "dvc", "repro"], repo)
        ran = re.findall(r"Running stage '([^']+)'", out)
        print(f"  embeddings overwritten in place: dvc repro {took:.1f} s, ran {', '.join(ran)}")
        took, out = run([sys.executable, "-m", "dvc", "repro"], repo)
        ran = re.findall(r"Running stage '([^']+)'", out)
        print(f"  nothing changed: dvc repro {took:.1f} s, ran {', '.join(ran) or 'nothing'}")
    finally:
        if args.keep:
            print(f"kept {repo}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
