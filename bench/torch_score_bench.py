"""CPU torch beside the numpy engine, in one run: ``score.backend: torch`` on ``device: cpu`` (the GPU code path)
against ``backend: numpy`` on clustered data like real embeddings, recall@K and the MAP@R family.

The issue's target: no worse than 1.3x the numpy engine at 10,000 x 50,000 x 512 (the default). Prints each
pass's wall time (the fastest of ``--repeat`` runs taken in turn, bench/torch_timing.py) and the ratio torch /
numpy; the rankings are compared too (every field a metric reads, byte for byte). Timings taken while other jobs
share the cores are noisy: quote an idle run, or the ratio of one run with its load average. On a busy machine
torch's intra-op threads wait for each other at every call (one descheduled thread stalls the rest), which the
numpy engine's per-core tiles do not: ``--torch-threads 1`` shows how much of a ratio that is. Exits 1 when a
ranking differs or the worst ratio is above 1.3x. From the project root:

    python bench/torch_score_bench.py                      # 10k x 50k x 512 (minutes on an idle machine)
    python bench/torch_score_bench.py --scale 0.05         # a quick look
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "bench"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import torch  # noqa: E402

from recallk.score.passes import Pass  # noqa: E402
from recallk.score.ranking import rank_data  # noqa: E402
from recallk.score.ranking.torch_backend import TorchOptions, rank_data_torch  # noqa: E402
from recallk.score.retrieval_data import RetrievalData  # noqa: E402
from torch_timing import best_of, clustered, identical, warm_up  # noqa: E402

#: The Python API's passes of the two metric families at ks (1, 5, 10): recall@K alone, and precision@K,
#: r_precision, map@r (the MAP@R family).
PASSES = {"recall@K": Pass.first(10), "MAP@R family": Pass.top(10, cap=10)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of 10,000 queries x 50,000 gallery")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--max-memory-mb", type=float, default=512)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each engine, in turn; the fastest counts")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch's intra-op threads (torch.set_num_threads; default: torch's own, one per core)")
    args = parser.parse_args(argv)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    n, m = max(1, int(10_000 * args.scale)), max(10, int(50_000 * args.scale))
    q, g, ql, gl = clustered(n, m, args.dim)
    data = RetrievalData(q, g, ql, gl, same_set=False)
    print(f"{n:,} queries x {m:,} gallery x {args.dim}-d, clustered; {os.cpu_count()} cores, torch "
          f"{torch.__version__} ({torch.get_num_threads()} threads), load average {os.getloadavg()[0]:.1f}")
    warm_up()
    worst, differ = 0.0, []
    for name, ranks in PASSES.items():
        best = best_of({"numpy": lambda ranks=ranks: rank_data(data, ranks, args.max_memory_mb),
                        "torch": lambda ranks=ranks: rank_data_torch(data, ranks, args.max_memory_mb,
                                                                     TorchOptions(device="cpu"))}, args.repeat)
        (numpy_s, want), (torch_s, got) = best["numpy"], best["torch"]
        same = identical(want, got)
        if not same:
            differ.append(name)
        worst = max(worst, torch_s / numpy_s)
        print(f"  {name:13s} numpy {numpy_s:7.2f} s  torch cpu {torch_s:7.2f} s  ratio {torch_s / numpy_s:5.2f}x  "
              f"rankings {'byte-identical' if same else 'DIFFER'}")
    print(f"worst ratio {worst:.2f}x (target <= 1.3x), fastest of {args.repeat}; load average now "
          f"{os.getloadavg()[0]:.1f}")
    if differ:
        print(f"rankings DIFFER for {', '.join(differ)}")
    return 1 if differ or worst > 1.3 else 0  # a wrong ranking, or the target missed: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
