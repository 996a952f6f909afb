"""``recallk datasets prepare NAME ROOT [--out DIR] [--apply] [--params FILE] [--strict] [--fold N]``.

Writes the manifest (and the captions and the protocol file), prints the protocol's name and sizes, the params
of the official protocol (YAML, on stdout) and the counts; with ``--apply`` writes the params into params.yaml
(comments kept). Exit 0, or 2 with one ``error:`` line."""

from __future__ import annotations

import argparse
import io
import logging
import sys
from typing import Sequence

from recallk.datasets import DATASETS, count_message, describe, prepare
from recallk.errors import InputError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="recallk datasets", description="Prepare a standard benchmark's manifest "
                                "and protocol params from its extracted official release (never downloads).")
    sub = p.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="write the manifest and print the protocol's params")
    prep.add_argument("name", choices=list(DATASETS), help="the benchmark")
    prep.add_argument("root", help="the extracted release (docs/datasets.md: each one's layout)")
    prep.add_argument("--out", default=None, help="folder of the manifest (ROOT, or a folder containing it); it "
                      "becomes split.data_root")
    prep.add_argument("--apply", action="store_true", help="write the params into params.yaml "
                      "(only their values change; with the manifest: both or neither)")
    prep.add_argument("--params", default="params.yaml", help="the params file --apply writes (default: %(default)s)")
    prep.add_argument("--strict", action="store_true", help="counts off the official release are an error")
    prep.add_argument("--fold", type=int, default=None, help="coco1k: the fold evaluated, 1 to 5 (1,000 test "
                      "images each, in the split file's order); run the five and average")
    prep.add_argument("--with-train", action="store_true", help="caption benchmarks: list the images not evaluated "
                      "too, as train (default: the evaluated images alone, so encode embeds no more)")
    return p


def params_yaml(params: dict) -> str:
    """The params as the YAML block a user pastes into params.yaml (flow-style lists)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    data = CommentedMap()
    for section, values in params.items():
        data[section] = CommentedMap()
        for key, value in values.items():
            if isinstance(value, list):
                value = CommentedSeq(value)
                value.fa.set_flow_style()
            data[section][key] = value
    out = io.StringIO()
    YAML().dump(data, out)
    return out.getvalue()


class _Drop(logging.Filter):
    """Drops the library's count warning while the command runs: the command prints it as its own `warning:`
    line (through the console's handler it would come twice)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logger, drop = logging.getLogger("recallk.datasets"), _Drop()
    logger.addFilter(drop)
    try:
        result = prepare(args.name, args.root, out=args.out, strict=args.strict,
                         apply_to=args.params if args.apply else None, fold=args.fold,
                         with_train=args.with_train)
    except InputError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    finally:
        logger.removeFilter(drop)
    if result.differences:
        sys.stderr.write(f"warning: {count_message(args.name, result.differences)}\n")
    counts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in result.counts.items())
    wrote = f"{result.manifest}, {result.captions}" if result.captions else f"{result.manifest}"
    sys.stdout.write(f"# {args.name}: wrote {wrote} ({counts})\n")
    sys.stdout.write(f"# protocol {describe(result.protocol)}\n")
    sys.stdout.write(params_yaml(result.params))
    if args.apply:
        sys.stdout.write(f"# written into {args.params}; run `dvc repro`\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())
