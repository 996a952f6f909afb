"""The data contract of the split stage: one declared pandera schema, validated lazily.

:func:`manifest_schema` declares every rule for the probed, split-assigned image
table; :func:`validate` runs it with ``lazy=True`` so every failure is collected,
then raises one :class:`~stages.common.UserError` that names each failing row and file.
"""

from __future__ import annotations

import pandas as pd
import pandera.pandas as pa

from stages.catalog import is_safe_relative
from stages.common import UserError
from stages.splitting import EVAL_SPLITS, SPLITS

#: How many failing rows to list per rule before summarising the rest.
MAX_ROWS_PER_RULE = 20

IMAGE_ID_RULE = "image_id must not contain line breaks or control characters"
PATH_RULE = "path must be relative to the data root, with no '..' part, no leading '/' and '/' separators"
LABEL_RULE = "label must not be empty (fill in the label or drop the row)"
PATH_ONCE_RULE = ("a path must be listed once: the same file under two image_ids would let a query retrieve "
                  "itself (drop the extra rows)")
FILE_RULE = "image file must exist inside the data root and decode with Pillow"
SPLIT_RULE = f"split must be one of {', '.join(SPLITS)} (fix the manifest's split column)"
LEAK_RULE = ("the same file (equal sha256) must not be in train and in val/gallery "
             "(leakage: delete the duplicate or move both copies to one split)")
DISJOINT_RULE = "class_disjoint: a label must not be in train and in val/gallery"


def _leaking(df: pd.DataFrame) -> pd.Series:
    """Rows whose file content also appears on the other side of the train/eval border."""
    is_eval = df["split"].isin(EVAL_SPLITS)
    known = df["sha256"].notna()
    train_sha = set(df.loc[known & df["split"].eq("train"), "sha256"])
    eval_sha = set(df.loc[known & is_eval, "sha256"])
    return known & df["sha256"].isin(train_sha & eval_sha)


def _label_overlap(df: pd.DataFrame) -> pd.Series:
    train_labels = set(df.loc[df["split"].eq("train"), "label"].dropna())
    eval_labels = set(df.loc[df["split"].isin(EVAL_SPLITS), "label"].dropna())
    return df["label"].isin(train_labels & eval_labels)


def manifest_schema(*, class_disjoint: bool) -> pa.DataFrameSchema:
    """The contract every image table must meet before the split stage writes anything.

    Columns: ``image_id`` (str, unique, non-null), ``path`` (str, safe relative),
    ``label`` (str, non-empty), ``sha256`` (str), ``width``/``height`` (Int64, > 0),
    ``problem`` (must be empty: the probe found no fault in the file) and
    ``split`` (train | val | gallery). Frame-wide: no train/eval leakage by file
    content, and under ``class_disjoint`` no label on both sides.
    """
    checks = [pa.Check(lambda df: ~_leaking(df), error=LEAK_RULE)]
    if class_disjoint:
        checks.append(pa.Check(lambda df: ~_label_overlap(df), error=DISJOINT_RULE))
    return pa.DataFrameSchema(
        {
            "image_id": pa.Column(str, pa.Check(lambda s: ~s.str.contains(r"[\x00-\x1f]", regex=True),
                                                error=IMAGE_ID_RULE), nullable=False, unique=True),
            "path": pa.Column(str, [pa.Check(lambda v: is_safe_relative(v), element_wise=True, error=PATH_RULE),
                                    pa.Check(lambda s: ~s.duplicated(keep=False), error=PATH_ONCE_RULE)],
                              nullable=False),
            "label": pa.Column(str, pa.Check(lambda s: s.str.strip().str.len() > 0, error=LABEL_RULE),
                               nullable=False),
            "sha256": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$"), nullable=True),
            "width": pa.Column("Int64", pa.Check.gt(0), nullable=True),
            "height": pa.Column("Int64", pa.Check.gt(0), nullable=True),
            "problem": pa.Column(str, pa.Check(lambda s: s.isna(), error=FILE_RULE), nullable=True),
            "split": pa.Column(str, pa.Check.isin(SPLITS, error=SPLIT_RULE), nullable=False),
        },
        checks=checks,
        strict=False,
        name="image manifest",
    )


_BUILTIN_RULES = {
    "field_uniqueness": "must be unique (give every row its own value)",
    "not_nullable": "must not be missing (fill it in or drop the row)",
}


def _describe_row(frame: pd.DataFrame, index: int, csv_lines: bool) -> str:
    row = frame.loc[index]
    parts = [f"CSV line {index + 2}"] if csv_lines else []
    parts.append(f"path {row['path']!r}")
    if row["image_id"] != row["path"]:
        parts.append(f"image_id {row['image_id']!r}")
    if isinstance(row.get("problem"), str):
        parts.append(row["problem"])
    return ", ".join(parts)


def format_failures(frame: pd.DataFrame, failures: pd.DataFrame, *, source: str, csv_lines: bool) -> str:
    """Group pandera's failure cases by rule and name every failing row (up to a limit per rule)."""
    failures = failures.dropna(subset=["index"])
    per_rule: dict[str, set[int]] = {}
    for column, check, index in failures[["column", "check", "index"]].itertuples(index=False):
        rule = check
        if check in _BUILTIN_RULES or check.startswith("str_matches") or check.startswith("greater_than"):
            rule = f"{column} {_BUILTIN_RULES.get(check, f'fails {check}')}"
        per_rule.setdefault(rule, set()).add(int(index))
    lines = [f"data contract failed for {source} ({len(per_rule)} rule(s) broken):"]
    for rule, rows in per_rule.items():
        ordered = sorted(rows)
        lines.append(f"  - {rule}: {len(ordered)} row(s)")
        lines.extend(f"      {_describe_row(frame, i, csv_lines)}" for i in ordered[:MAX_ROWS_PER_RULE])
        if len(ordered) > MAX_ROWS_PER_RULE:
            lines.append(f"      ... and {len(ordered) - MAX_ROWS_PER_RULE} more")
    return "\n".join(lines)


def validate(frame: pd.DataFrame, *, class_disjoint: bool, source: str, csv_lines: bool) -> None:
    """Validate ``frame`` against :func:`manifest_schema`; raise one UserError listing every failure."""
    schema = manifest_schema(class_disjoint=class_disjoint)
    try:
        schema.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise UserError(format_failures(frame, exc.failure_cases, source=source, csv_lines=csv_lines)) from None
