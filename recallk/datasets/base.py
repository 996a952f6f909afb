"""What every dataset adapter shares: the :class:`Dataset` it reads, the official counts it checks, and the
helpers that read the release's text files and check the relations between their lines (one line per id, one
class per image, class ids integer and inside the release's range, one spelling per id), each refusal one
:class:`~recallk.errors.InputError` naming the file, the line and the rule."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence

import pandas as pd

from recallk.data.contract import PATH_RULE, is_safe_relative
from recallk.errors import InputError, clip, quote

#: Missing image files named in one error, before "and N more".
SHOWN_MISSING = 5
#: The advice closing every refusal of a damaged release.
REPAIR = "Re-extract the release, or correct the line or file named"


@dataclass(frozen=True)
class Dataset:
    """One benchmark: its name, the release it reads, the expected layout (a sentence for errors and docs),
    its reader, the official counts, the protocol's params, its source and its name.

    ``read(root)`` returns the manifest rows (``path`` relative to ``root``, ``label``, ``split``, extra
    columns, and ``source``: where each row comes from, "line 3 of 'ROOT/images.txt'", which :func:`prepare`
    names in its errors and drops; the caption benchmarks' rows also ``image_id`` and the internal ``captions``,
    ``karpathy`` and ``fold``: :mod:`recallk.datasets.karpathy`) and the counts measured, keyed like
    ``official``."""

    name: str
    release: str
    layout: str
    read: Callable[[Path, "Dataset"], tuple[pd.DataFrame, dict[str, int]]]
    official: dict[str, int]
    protocol: str
    score: dict[str, Any] = field(default_factory=dict)
    source: str = ""
    #: The protocol's name, in every output (printed, the protocol file): ``cub200-classes-101-200-loo``; a
    #: ``{fold}`` in it (COCO 1K) is the fold chosen.
    protocol_name: str = ""

    def missing(self, root: Path, what: str) -> InputError:
        """The error of a file or folder ``what`` the release should have under ``root``."""
        return InputError(f"{self.name}: {quote(str(root / what))} not found: {quote(str(root))} is not an "
                          f"extracted copy of {self.release}. Expected layout: {self.layout}")

    def refuse(self, where: str, what: str, rule: str) -> InputError:
        """The error of a damaged release: ``where`` (a line of a file), what it holds, the rule it breaks."""
        return InputError(f"{self.name}: {where} {what}: {rule}. {REPAIR}.")


class Row(NamedTuple):
    """A line of a release's list file: its number (from 1) and its fields (the pattern's groups)."""

    number: int
    fields: tuple[str, ...]


def where(path: Path, number: int) -> str:
    """"line 3 of 'ROOT/images.txt'": a row's place in the messages and in the manifest's ``source``."""
    return f"line {number} of {quote(str(path))}"


def in_folder(path: Path) -> str:
    """"file '0002_c1s1_000451_03.jpg' of 'ROOT/query'": the ``source`` of a row read from a folder."""
    return f"file {quote(path.name)} of {quote(str(path.parent))}"


def scanned(path: Path, root: Path, ds: Dataset) -> str:
    """The path under ``root`` of a file a folder scan found (re-ID folders, Cars' class folders): UTF-8 text,
    or the error naming it (a name in another encoding reaches Python with lone surrogates, which the manifest,
    a UTF-8 CSV, cannot hold)."""
    rel = path.relative_to(root).as_posix()
    try:
        rel.encode("utf-8")
    except UnicodeEncodeError:
        raise ds.refuse(in_folder(path), "has a name that is not UTF-8 text", "file and folder names must be UTF-8 "
                        "(this one was written in another encoding, as an archive extracted under another locale); "
                        "rename it") from None
    return rel


def need(root: Path, ds: Dataset, *names: str) -> Path:
    """The first of ``names`` that exists under ``root`` (a release's alternative places), or the error
    naming the first."""
    for name in names:
        if (root / name).exists():
            return root / name
    raise ds.missing(root, names[0])


def read_lines(path: Path, ds: Dataset) -> list[str]:
    """The lines of a release's text file: UTF-8 (a byte-order mark dropped, as the manifest reader does), or
    an InputError naming the file and what it is instead (a folder, another encoding)."""
    if path.is_dir():
        raise InputError(f"{ds.name}: {quote(str(path))} is a folder, not the release's text file. Expected "
                         f"layout: {ds.layout}")
    try:
        return path.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"{ds.name}: {quote(str(path))} is not UTF-8 text (byte {exc.start} is "
                         f"{exc.object[exc.start:exc.start + 1]!r}): the release's files are plain ASCII; re-extract "
                         "it, or save the file as UTF-8.") from None
    except OSError as exc:
        raise InputError(f"{ds.name}: {quote(str(path))} cannot be read ({clip(str(exc))}); fix its "
                         "permissions or re-extract the release.") from None


#: A header entry of :func:`read_rows`: the line holds the number of rows that follow (In-shop's first line).
COUNT_LINE = r"\d+"


def read_rows(path: Path, ds: Dataset, pattern: str, header: Sequence[str] = ()) -> list[Row]:
    """The rows of a release's text file (blank lines ignored), each matched by ``pattern``, after its
    ``header`` lines (each the exact words of a line, or :data:`COUNT_LINE`: the number of rows).

    Refused, naming the file and the line: a header line that is not there (a file without it would lose its
    first image), a count line that is not the number of rows, a row not in the release's format."""
    lines = read_lines(path, ds)
    count = None
    for number, want in enumerate(header, start=1):
        line = lines[number - 1] if len(lines) >= number else ""
        if want is COUNT_LINE and re.fullmatch(COUNT_LINE, line.strip()):
            count = int(line)
        elif line.split() != want.split():
            expected = "the number of images listed" if want is COUNT_LINE else quote(want)
            raise ds.refuse(where(path, number), f"is {quote(clip(line))}",
                            f"the release's header line {number} is {expected} (a file without it would lose its "
                            "first image to the header)")
    out, rule = [], re.compile(pattern)
    for number, line in enumerate(lines[len(header):], start=len(header) + 1):
        if not line.strip():
            continue
        match = rule.fullmatch(line.strip())
        if match is None:
            raise InputError(f"{ds.name}: line {number} of {quote(str(path))} is {quote(clip(line))}, not in "
                             f"the release's format. Expected layout: {ds.layout}")
        out.append(Row(number, match.groups()))
    if not out:
        raise InputError(f"{ds.name}: {quote(str(path))} lists no images. Expected layout: {ds.layout}")
    if count is not None and count != len(out):
        raise ds.refuse(where(path, 1), f"says {count:,} images", f"the count line must equal the rows listed "
                        f"({len(out):,} here)")
    return out


def listed_once(keys: Iterable[Any], places: Sequence[str], ds: Dataset, what: str, rule: str) -> None:
    """Each key (an image id, a path, a class name) at one place only, or the error naming both places:
    "line 9 of 'ROOT/images.txt' lists image id 4 again (first at line 4 of ...): <rule>"."""
    first: dict[Any, int] = {}
    for n, key in enumerate(keys):
        if key in first:
            raise ds.refuse(places[n], f"lists {what} {quote(key)} again (first at {places[first[key]]})", rule)
        first[key] = n


def integer_in(value: Any, low: int, high: int, place: str, ds: Dataset, what: str) -> int:
    """``value`` (a list file's text, a .mat number) as an integer within ``[low, high]``, the release's
    range, or the error naming the place: ``98.6`` is not class 98, ``0`` and ``999`` are not CUB's classes."""
    try:  # a list file's text is digits; a .mat holds doubles (98.6 is no class, 98.0 is class 98)
        number = float(value) if not isinstance(value, str) or (value.isascii() and value.isdigit()) else float("nan")
    except (TypeError, ValueError):
        number = float("nan")
    if not number.is_integer() or not low <= number <= high:
        raise ds.refuse(place, f"gives {what} {quote(value)}", f"a {what} of {ds.release} is a whole number "
                        f"from {low} to {high}")
    return int(number)


def one_spelling(texts: Sequence[str], places: Sequence[str], ds: Dataset, what: str) -> None:
    """Numeric ids (persons, cameras, items) written one way each: ``c1`` and ``c01``, ``10`` and ``0010``
    would be two cameras or two persons to the catalog (and the re-ID junk rule compares the text)."""
    spelling: dict[int, tuple[str, int]] = {}
    for n, text in enumerate(texts):
        number = int(text)
        seen = spelling.setdefault(number, (text, n))
        if seen[0] != text:
            raise ds.refuse(places[n], f"writes {what} {number} as {quote(text)}",
                            f"{places[seen[1]]} writes it {quote(seen[0])}; one spelling per {what} (the catalog "
                            "compares the text: two spellings would be two different ones)")


def check_paths(frame: pd.DataFrame, root: Path, data_root: Path, ds: Dataset) -> None:
    """The split stage's path rule, applied before a manifest is written: every ``path`` relative with no
    ``..`` part (:func:`~recallk.data.contract.is_safe_relative`), an existing file whose real path (links
    resolved) is inside ``data_root`` (the split's data root) and named by one row only. Missing files are
    counted and the first named; any other breach is the error naming the row's ``source``."""
    resolved = data_root.resolve()
    gone, real = [], []
    for path, place in zip(frame["path"], frame["source"]):
        if not is_safe_relative(path):
            raise ds.refuse(place, f"names {quote(path)}", f"the split stage's rule: {PATH_RULE}")
        full = root / path
        real.append(os.path.realpath(full))
        if not Path(real[-1]).is_relative_to(resolved):
            raise ds.refuse(place, f"names {quote(path)}, which resolves to {quote(real[-1])}",
                            f"the split stage's rule: every image inside the data root {quote(str(data_root))} "
                            "(a link out of it is refused: copy the file into the release)")
        if not full.is_file():
            gone.append(path)
    if gone:
        more = f" and {len(gone) - SHOWN_MISSING} more" if len(gone) > SHOWN_MISSING else ""
        raise InputError(f"{ds.name}: {len(gone)} listed image(s) missing under {quote(str(root))}: "
                         f"{', '.join(quote(p) for p in gone[:SHOWN_MISSING])}{more}. Extract the whole release "
                         f"there. Expected layout: {ds.layout}")
    listed_once(real, frame["source"].tolist(), ds, "the image file",
                "one line per image (the same file twice would be two images with one or two classes)")


def differences(measured: dict[str, int], official: dict[str, int]) -> list[str]:
    """One phrase per count that differs from the official release: "test images 12 (official 5,924)"."""
    return [f"{key.replace('_', ' ')} {measured.get(key, 0):,} (official {want:,})"
            for key, want in official.items() if measured.get(key, 0) != want]
