"""The data contracts: declared pandera schemas, validated lazily.

* :func:`image_table_schema`: every rule for the probed, split-assigned image
  table, checked before the split stage writes anything;
* :func:`catalog_schema` and :func:`split_schema`: the two files the split stage
  writes, over the text each CSV cell holds, checked when they are written and
  again when a later stage reads them.

The column rules are declared once (``_columns``) and shared by the schemas.
:func:`validate` runs a schema with ``lazy=True``, so every failure is collected,
then raises one :class:`~recallk.errors.InputError` that names each failing row and file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath

import pandas as pd
import pandera.pandas as pa

from recallk.errors import InputError, quote

SPLITS = ("train", "val", "gallery")
EVAL_SPLITS = ("val", "gallery")

#: How many failing rows to list per rule before summarising the rest.
MAX_ROWS_PER_RULE = 20
#: How many groups (one file under several rows) to list per rule before summarising the rest, and how many
#: rows of each group.
MAX_GROUPS_PER_RULE, MAX_ROWS_PER_GROUP = 10, 10

#: Longest image_id, in characters: ids are stored as fixed-width strings (ids.npy), so one very long id
#: would make every row that wide (a 1 MB id times 50,000 rows is 200 GB).
MAX_ID_LENGTH = 512
#: What an id, path or label must not hold: C0 and C1 controls and DEL (NUL, line breaks, NEL ``\x85``), the
#: Unicode line and paragraph separators (U+2028, U+2029) and the bidirectional controls that make text show
#: in another order (``abc\u202egpj.exe`` shows as ``abcexe.jpg``): U+061C, U+200E/F, U+202A-E, U+2066-9.
CONTROL_CHARACTERS = "\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_CONTROL = re.compile(f"[{CONTROL_CHARACTERS}]")
_CONTROLS = "control characters (C0/C1 controls, U+2028/U+2029, bidirectional marks and overrides)"
IMAGE_ID_RULE = f"image_id must not contain line breaks or {_CONTROLS}"
ID_LENGTH_RULE = (f"image_id must be at most {MAX_ID_LENGTH} characters (ids are stored fixed-width: shorten "
                  "the id or the file's path)")
PATH_RULE = ("path must be relative to the data root, with no '..' part, no leading '/', no drive letter or URL "
             "scheme, no control characters (NUL, line breaks, C1 controls, bidi overrides) and '/' separators")
LABEL_RULE = "label must not be empty (fill in the label or drop the row)"
LABEL_TEXT_RULE = (f"label must not contain line breaks or {_CONTROLS} (one rule for label folders and "
                   "manifests: rename the label)")
PATH_ONCE_RULE = ("a file must be listed once (paths are compared with '.', '//' and symlinks resolved): "
                  "the same file under two image_ids would let a query retrieve itself (drop the extra rows)")
EVAL_ONCE_RULE = ("byte-identical files (equal sha256) must not be in val/gallery under two image_ids: they are "
                  "one image, and a query would retrieve its own copy (delete the copies or drop their rows)")
FILE_RULE = "image file must exist inside the data root and decode with Pillow"
SPLIT_RULE = f"split must be one of {', '.join(SPLITS)} (fix the manifest's split column)"
FLAG_RULE = "query and gallery must be True or False"
COUNT_RULE = "width and height must be positive integers"
LEAK_RULE = ("the same file (equal sha256) must not be in train and in val/gallery "
             "(leakage: delete the duplicate or move both copies to one split)")
DISJOINT_RULE = "class_disjoint: a label must not be in train and in val/gallery"
FILES_RULE = ("every catalog row describes an image file (path, sha256, width, height and phash all filled in), "
              "or none does (an embeddings-only catalog: all five empty)")


#: A Windows drive (``C:``, ``c:dir``) or a URL scheme (``http://``, ``s3://``) at the start of a path.
_DRIVE_OR_URL = re.compile(r"^(?:[A-Za-z]:|[A-Za-z][A-Za-z0-9+.-]*://)")


def is_safe_relative(path: object) -> bool:
    """True for a relative POSIX path with no ``..`` part (a string, not absolute, no drive letter or
    URL scheme, no control character such as NUL or a line break). A ``:`` elsewhere is an ordinary
    character (a label folder ``type:A`` is fine)."""
    if not isinstance(path, str) or not path or "\\" in path or _CONTROL.search(path):
        return False
    p = PurePosixPath(path)
    return not p.is_absolute() and ".." not in p.parts and not _DRIVE_OR_URL.match(path)


def _leaking(df: pd.DataFrame) -> pd.Series:
    """Rows whose file content also appears on the other side of the train/eval border."""
    is_eval = df["split"].isin(EVAL_SPLITS)
    known = df["sha256"].notna()
    train_sha = set(df.loc[known & df["split"].eq("train"), "sha256"])
    eval_sha = set(df.loc[known & is_eval, "sha256"])
    return known & df["sha256"].isin(train_sha & eval_sha)


def _same_file(df: pd.DataFrame) -> pd.Series:
    """Rows naming a file that another row names too: equal real paths (the probe's ``real_path``;
    the path text where the probe could not resolve it)."""
    key = df["real_path"].where(df["real_path"].notna(), "path:" + df["path"].astype(str))
    return key.duplicated(keep=False)


def _repeated_in_eval(df: pd.DataFrame) -> pd.Series:
    """Val/gallery rows whose file content (sha256) another val/gallery row has too."""
    known_eval = df["split"].isin(EVAL_SPLITS) & df["sha256"].notna()
    return known_eval & df["sha256"].where(known_eval).duplicated(keep=False)


def _blank(s: pd.Series) -> pd.Series:
    """Missing or empty cells (a catalog read back from CSV holds ``""`` where it was written empty)."""
    return s.isna() | s.astype(object).eq("")


def _files_mixed(df: pd.DataFrame) -> pd.Series:
    """Rows that break :data:`FILES_RULE`: some file columns filled and others empty, or a row without a
    file in a catalog whose other rows have one (the majority of rows decides which rows are named)."""
    blank = pd.concat([_blank(df[c]) for c in ("path", "sha256", "width", "height", "phash")], axis=1)
    partial = blank.any(axis=1) & ~blank.all(axis=1)
    with_files = ~blank.any(axis=1)
    odd = ~with_files if with_files.sum() * 2 >= len(df) else with_files
    return partial | (odd if with_files.any() and not with_files.all() else False)


def _label_overlap(df: pd.DataFrame) -> pd.Series:
    train_labels = set(df.loc[df["split"].eq("train"), "label"].dropna())
    eval_labels = set(df.loc[df["split"].isin(EVAL_SPLITS), "label"].dropna())
    return df["label"].isin(train_labels & eval_labels)


def _image_id_checks() -> list[pa.Check]:
    """The rules of an image_id's text (the catalog's, and the captions' reference to it)."""
    return [pa.Check(lambda s: ~s.str.contains(_CONTROL, regex=True), error=IMAGE_ID_RULE),
            pa.Check(lambda s: s.str.len() <= MAX_ID_LENGTH, error=ID_LENGTH_RULE)]


def _columns() -> dict[str, pa.Column]:
    """Each column's rule, declared once; the schemas below pick theirs."""
    def flag() -> pa.Column:
        return pa.Column(str, pa.Check.isin(["True", "False"], error=FLAG_RULE), nullable=False)

    def sha256(nullable: bool) -> pa.Column:
        return pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{64}$"), nullable=nullable)

    def count() -> pa.Column:
        return pa.Column(str, pa.Check.str_matches(r"^[1-9][0-9]*$", error=COUNT_RULE), nullable=False)

    def blank_or(pattern: str, error: str | None = None) -> pa.Column:
        """A text column that matches ``pattern`` or is empty (an embeddings-only catalog; FILES_RULE decides)."""
        return pa.Column(str, pa.Check(lambda s: _blank(s) | s.astype(str).str.fullmatch(pattern),
                                       error=error or f"str_matches('{pattern}')"), nullable=True)

    return {
        "image_id": pa.Column(str, _image_id_checks(), nullable=False, unique=True),
        "path": pa.Column(str, pa.Check(lambda v: is_safe_relative(v), element_wise=True, error=PATH_RULE),
                          nullable=False),
        "real_path": pa.Column(str, nullable=True),  # none for a path that is not safe (the path rule says so)
        "label": pa.Column(str, [pa.Check(lambda s: s.str.strip().str.len() > 0, error=LABEL_RULE),
                                 pa.Check(lambda s: ~s.str.contains(_CONTROL, regex=True),
                                          error=LABEL_TEXT_RULE)], nullable=False),
        "sha256": sha256(nullable=True),  # none for an unreadable file, which the problem rule reports
        "sha256_file": blank_or(r"[0-9a-f]{64}"),
        "phash": pa.Column(str, pa.Check.str_matches(r"^[0-9a-f]{16}$"), nullable=True),
        "phash_file": blank_or(r"[0-9a-f]{16}"),
        "width": pa.Column("Int64", pa.Check.gt(0), nullable=True),
        "height": pa.Column("Int64", pa.Check.gt(0), nullable=True),
        "problem": pa.Column(str, pa.Check(lambda s: s.isna(), error=FILE_RULE), nullable=True),
        "split": pa.Column(str, pa.Check.isin(SPLITS, error=SPLIT_RULE), nullable=False),
        "query": flag(),
        "gallery": flag(),
        "width_text": blank_or(r"[1-9][0-9]*", error=COUNT_RULE),
        "height_text": blank_or(r"[1-9][0-9]*", error=COUNT_RULE),
    }


def image_table_schema(*, class_disjoint: bool, files: bool = True) -> pa.DataFrameSchema:
    """The contract every image table must meet before the split stage writes anything.

    Columns: ``image_id`` (str, unique, non-null), ``path`` (str, safe relative),
    ``real_path`` (the probe's resolved path), ``label`` (str, non-empty), ``sha256`` (str),
    ``width``/``height`` (Int64, > 0), ``phash`` (16 hex characters), ``problem`` (must be empty:
    the probe found no fault in the file) and ``split`` (train | val | gallery). Frame-wide: every
    file listed once (by real path, so ``a/./0.png``, ``a//0.png`` and a symlink alias are ``a/0.png``),
    no train/eval leakage by file content, no file content twice in val/gallery (a byte-identical
    copy is the same image: refused rather than silently excluded, so the numbers never depend
    on which copy a query is), and under ``class_disjoint`` no label on both sides.

    ``files=False`` (a manifest of ids, embeddings-only): only ``image_id``, ``label`` and ``split``,
    and the label rule of ``class_disjoint``; nothing about files can be checked.
    """
    checks = [pa.Check(lambda df: ~_same_file(df), error=PATH_ONCE_RULE),
              pa.Check(lambda df: ~_leaking(df), error=LEAK_RULE),
              pa.Check(lambda df: ~_repeated_in_eval(df), error=EVAL_ONCE_RULE)] if files else []
    if class_disjoint:
        checks.append(pa.Check(lambda df: ~_label_overlap(df), error=DISJOINT_RULE))
    columns = _columns()
    names = (("image_id", "path", "real_path", "label", "sha256", "width", "height", "phash", "problem", "split")
             if files else ("image_id", "label", "split"))
    return pa.DataFrameSchema({c: columns[c] for c in names}, checks=checks, strict=False, name="image table")


def catalog_schema() -> pa.DataFrameSchema:
    """The catalog file as text: ``image_id`` (unique), ``path`` (where the encode stage reads the
    image: relative to the working directory or absolute), ``label``, ``sha256``, ``width``,
    ``height``, ``phash``; extra manifest columns are kept as they are. The five file columns are
    all filled in on every row, or all empty on every row (an embeddings-only catalog)."""
    columns = _columns()
    return pa.DataFrameSchema({"image_id": columns["image_id"], "path": pa.Column(str, nullable=True),
                               "label": columns["label"], "sha256": columns["sha256_file"],
                               "width": columns["width_text"], "height": columns["height_text"],
                               "phash": columns["phash_file"]},
                              checks=[pa.Check(lambda df: ~_files_mixed(df), error=FILES_RULE)],
                              strict=False, name="catalog")


def has_files(catalog: pd.DataFrame) -> bool:
    """Whether a catalog (checked by :func:`catalog_schema`) lists image files, or only ids (embeddings-only)."""
    return bool(len(catalog)) and not bool(_blank(catalog["path"]).all())


def check_catalog_paths(catalog: pd.DataFrame, data_root: str | None, catalog_csv: str) -> None:
    """The split stage's path rule, applied again where the catalog is read: every ``path`` is the data root
    joined with a relative path with no ``..`` part (:func:`is_safe_relative`; the split
    stage writes it relative to the working directory, or absolute when the root is outside it). Without a
    known ``data_root`` (the split's provenance.json absent: a stage run by hand) the path itself must be
    relative with no ``..`` part. A tampered catalog cannot make a stage (encode, score, index) open a file
    outside the data: every reader of the catalog applies this one rule
    (:func:`stages.runner.read_catalog`)."""
    root = Path(os.path.abspath(data_root)) if data_root else None
    bad = []
    for line, path in enumerate(catalog["path"].tolist(), start=2):
        if root is None:
            ok = is_safe_relative(path)
        else:
            ok = isinstance(path, str) and "\x00" not in path
            if ok:
                try:
                    rel = Path(os.path.abspath(path)).relative_to(root).as_posix()
                except ValueError:
                    rel = ""
                ok = is_safe_relative(rel) and is_safe_relative(path if not os.path.isabs(path) else rel)
        if not ok:
            bad.append(f"line {line} ({quote(path)})")
    if bad:
        where = f"inside the data root {quote(data_root)}" if data_root else "relative, with no '..' part"
        raise InputError(f"{catalog_csv} lists {len(bad)} path(s) that are not {where}: {', '.join(bad[:5])}"
                         f"{' ...' if len(bad) > 5 else ''}. The split stage never writes such a path: the catalog "
                         "was edited; re-run split (`dvc repro -f split`).")


def split_schema() -> pa.DataFrameSchema:
    """The split file as text: ``image_id`` (unique), ``split`` (train | val | gallery), and the
    ``query`` / ``gallery`` roles (``True`` or ``False``)."""
    columns = _columns()
    return pa.DataFrameSchema({c: columns[c] for c in ("image_id", "split", "query", "gallery")},
                              strict=False, name="split")


#: Longest caption, in characters: a caption is a sentence or a paragraph (text towers read the first few dozen
#: tokens), and captions are stored and hashed whole.
MAX_CAPTION_LENGTH = 10_000
CAPTION_EMPTY_RULE = "caption must not be empty or blank (write the caption or drop the row)"
CAPTION_TEXT_RULE = (f"caption must not contain line breaks, tabs or {_CONTROLS} (one caption is one line of "
                     "text: join its lines with a space)")
CAPTION_LENGTH_RULE = (f"caption must be at most {MAX_CAPTION_LENGTH:,} characters (a caption, not a document: "
                       "shorten it)")
CAPTION_IMAGE_RULE = ("image_id must name an image of the catalog (a manifest's image_id; for label folders the "
                      "path relative to the data root): fix the id or drop the row")
CAPTION_ID_RULE = ("caption_id must be <image_id>#<n>, n the 0-based order of that image's captions in the file "
                   "(the split stage writes it so)")


def _caption_checks() -> list[pa.Check]:
    """The rules of a caption's text, on the captions file and on the captions table alike."""
    return [pa.Check(lambda s: s.str.strip().str.len() > 0, error=CAPTION_EMPTY_RULE),
            pa.Check(lambda s: ~s.str.contains(_CONTROL, regex=True), error=CAPTION_TEXT_RULE),
            pa.Check(lambda s: s.str.len() <= MAX_CAPTION_LENGTH, error=CAPTION_LENGTH_RULE)]


def caption_source_schema(image_ids: set[str]) -> pa.DataFrameSchema:
    """The captions file a user gives (``split.captions``): ``image_id`` names an image of ``image_ids`` (the
    catalog's), ``caption`` is one non-blank line of at most :data:`MAX_CAPTION_LENGTH` characters. Other
    columns are ignored."""
    return pa.DataFrameSchema(
        {"image_id": pa.Column(str, pa.Check(lambda s: s.isin(image_ids), error=CAPTION_IMAGE_RULE), nullable=False),
         "caption": pa.Column(str, _caption_checks(), nullable=False)},
        strict=False, name="captions file")


def _caption_ids_ok(df: pd.DataFrame) -> pd.Series:
    """Rows whose caption_id is ``<image_id>#<n>``, n counting that image's rows in file order from 0."""
    n = df.groupby("image_id", sort=False).cumcount().astype(str)
    return df["caption_id"].astype(str).eq(df["image_id"].astype(str) + "#" + n)


def captions_schema() -> pa.DataFrameSchema:
    """The captions table the split stage writes (``data/prepared/captions.csv``), as text: ``caption_id``
    (unique, ``<image_id>#<n>``), ``image_id`` (a catalog image), ``caption`` (the caption rules of
    :func:`caption_source_schema`) and ``split`` (the image's: train | val | gallery). Header only without
    captions."""
    columns = _columns()
    return pa.DataFrameSchema(
        {"caption_id": pa.Column(str, nullable=False, unique=True),
         "image_id": pa.Column(str, _image_id_checks(), nullable=False),
         "caption": pa.Column(str, _caption_checks(), nullable=False),
         "split": columns["split"]},
        checks=[pa.Check(_caption_ids_ok, error=CAPTION_ID_RULE)], strict=False, name="captions")


#: A label that is a decimal number as written (``7``, ``07``, ``7.0``, ``-7``, ``7e0``): no sign of ``nan`` or ``inf``.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: Groups of labels :func:`same_number_labels` names before summarising the rest.
MAX_LABEL_GROUPS = 5


def same_number_labels(labels: pd.Series) -> str | None:
    """The warning for labels that are one number written differently (``7``, ``7.0``, ``07``), or None.

    Labels are text (a folder name, a manifest cell read as text), so such labels are different classes: a
    query of ``7`` never counts a gallery image of ``07`` as a match, and recall drops with nothing said. The
    number is compared exactly (:class:`decimal.Decimal`), so ``10000000000000001`` is not ``1e16``. Each group
    is named with its labels' image counts, in the order the labels first occur."""
    from decimal import Decimal

    counts = labels.dropna().astype(str).value_counts(sort=False)
    by_number: dict[Decimal, list[str]] = {}
    for label in counts.index:
        if _NUMBER.fullmatch(label.strip()):
            by_number.setdefault(Decimal(label.strip()), []).append(label)  # equal and hashed by value
    groups = [names for names in by_number.values() if len(names) > 1]
    if not groups:
        return None

    def shown(label: str) -> str:  # quoted when spaces around it are what differs
        return label if label == label.strip() else quote(label)

    def listed(names: list[str]) -> str:
        return f"{', '.join(map(shown, names[:-1]))} and {shown(names[-1])}"

    said = [f"labels {listed(names)} are the same number but different text: "
            f"{sum(int(counts[n]) for n in names)} images in {len(names)} classes "
            f"({', '.join(f'{shown(n)}: {int(counts[n])}' for n in names)})" for names in groups[:MAX_LABEL_GROUPS]]
    if len(groups) > MAX_LABEL_GROUPS:
        said.append(f"and {len(groups) - MAX_LABEL_GROUPS} more such group(s)")
    return ("; ".join(said) + "; they are scored as different labels (a query never counts an image of the other "
            "spelling as a match). Write each number one way in the manifest (or the label folders' names).")


def as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """The text each CSV cell of ``frame`` will hold (what :func:`catalog_schema` and :func:`split_schema` check)."""
    return frame.astype(object).where(frame.notna(), None).map(lambda v: v if v is None else str(v))


#: The rules about one file under several rows: their failing rows are listed by file, one line per group,
#: with the column that tells the rows of one file apart: its content or its resolved path.
_GROUPED_RULES = {EVAL_ONCE_RULE: "sha256", LEAK_RULE: "sha256", PATH_ONCE_RULE: "real_path"}

_BUILTIN_RULES = {
    "field_uniqueness": "must be unique (give every row its own value)",
    "not_nullable": "must not be missing (fill it in or drop the row)",
}


#: Columns every failing row is named by (:func:`_describe_row`), so their values are not echoed twice.
_NAMED_COLUMNS = ("image_id", "path", "problem")


def _describe_row(frame: pd.DataFrame, index: int, csv_lines: bool) -> str:
    row = frame.loc[index]
    parts = [f"CSV line {index + 2}"] if csv_lines else []
    has_path = isinstance(row.get("path"), str) and row.get("path") != ""
    if has_path:
        parts.append(f"path {quote(row['path'])}")
    if not has_path or row["image_id"] != row["path"]:
        parts.append(f"image_id {quote(row['image_id'])}")
    if isinstance(row.get("problem"), str):
        parts.append(row["problem"])
    return ", ".join(parts)


def format_failures(frame: pd.DataFrame, failures: pd.DataFrame, *, source: str, csv_lines: bool) -> str:
    """Group pandera's failure cases by rule and name every failing row (up to a limit per rule)."""
    failures = failures.dropna(subset=["index"])
    per_rule: dict[str, set[int]] = {}
    given: dict[tuple[str, int], str] = {}  # (rule, row) -> the failing cell, quoted, for a column rule
    for column, check, index, case in failures[["column", "check", "index", "failure_case"]].itertuples(index=False):
        rule = check
        if check in _BUILTIN_RULES or check.startswith(("str_matches", "greater_than", "column_in_dataframe",
                                                          "dtype")):
            rule = f"{column} {_BUILTIN_RULES.get(check, f'fails {check}')}"
        per_rule.setdefault(rule, set()).add(int(index))
        # the row names image_id and path already; any other column's bad value is echoed (a split `tset`)
        if column in frame.columns and column not in _NAMED_COLUMNS and isinstance(case, str):
            given[(rule, int(index))] = f", {column} {quote(case)}"
    lines = [f"data contract failed for {source} ({len(per_rule)} rule(s) broken):"]
    for rule, rows in per_rule.items():
        ordered = sorted(rows)
        if rule in _GROUPED_RULES and _GROUPED_RULES[rule] in frame.columns:
            lines.extend(_grouped_lines(frame, rule, ordered, csv_lines))
            continue
        lines.append(f"  - {rule}: {len(ordered)} row(s)")
        lines.extend(f"      {_describe_row(frame, i, csv_lines)}{given.get((rule, i), '')}"
                     for i in ordered[:MAX_ROWS_PER_RULE])
        if len(ordered) > MAX_ROWS_PER_RULE:
            lines.append(f"      ... and {len(ordered) - MAX_ROWS_PER_RULE} more")
    return "\n".join(lines)


def _grouped_lines(frame: pd.DataFrame, rule: str, rows: list[int], csv_lines: bool) -> list[str]:
    """A rule of :data:`_GROUPED_RULES`: its failing ``rows`` by file (equal sha256, or equal resolved path),
    one line per file naming its rows, the first :data:`MAX_GROUPS_PER_RULE` files."""
    column = _GROUPED_RULES[rule]
    keys = frame.loc[rows, column]
    if column == "real_path":  # as _same_file: the path text where the probe could not resolve it
        keys = keys.where(keys.notna(), "path:" + frame.loc[rows, "path"].astype(str))
    groups: dict[str, list[int]] = {}
    for index, key in zip(rows, keys):
        groups.setdefault(str(key), []).append(index)
    what = "file content" if column == "sha256" else "file"
    lines = [f"  - {rule}: {len(rows)} row(s), {len(groups)} {what}(s)"]
    for key, members in list(groups.items())[:MAX_GROUPS_PER_RULE]:
        named = (f"sha256 {key[:12]}..." if column == "sha256" else
                 f"file {quote(key.removeprefix('path:'))}")
        described = [_describe_row(frame, i, csv_lines) + (f" ({frame.at[i, 'split']})" if column == "sha256"
                                                           and "split" in frame.columns else "")
                     for i in members[:MAX_ROWS_PER_GROUP]]
        more = [f"and {len(members) - MAX_ROWS_PER_GROUP} more"] if len(members) > MAX_ROWS_PER_GROUP else []
        lines.append(f"      {named} ({len(members)} rows): {'; '.join(described + more)}")
    if len(groups) > MAX_GROUPS_PER_RULE:
        rest = list(groups.values())[MAX_GROUPS_PER_RULE:]
        lines.append(f"      ... and {len(rest)} more {what}(s) ({sum(map(len, rest))} rows)")
    return lines


def validate(frame: pd.DataFrame, schema: pa.DataFrameSchema, *, source: str, csv_lines: bool) -> None:
    """Validate ``frame`` against ``schema`` lazily; raise one InputError listing every failure."""
    missing = [c for c in schema.columns if c not in frame.columns]
    if missing:
        raise InputError(f"{source} lacks column(s) {', '.join(missing)} of the {schema.name}; "
                         f"found: {', '.join(quote(str(c)) for c in frame.columns)}.")
    try:
        schema.validate(frame, lazy=True)
    except pa.errors.SchemaErrors as exc:
        raise InputError(format_failures(frame, exc.failure_cases, source=source, csv_lines=csv_lines)) from None
