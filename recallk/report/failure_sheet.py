"""The failure gallery: a contact sheet of the worst queries and what they retrieved (``plots/failures.png``).

One row per query, the worst first (lowest ``ap@r``, then the deepest first positive,
ties by image_id): the query framed blue, captioned with its id and label; its top k retrieved
items framed green (same label) or red (another), each captioned ``+`` (same label) or ``x``
(another) with its label in text and its cosine (a caption too wide for its tile keeps its start and end,
the middle elided as ``..``), so the sheet reads without colour too; then
its first positive framed grey with its rank. A legend at the top says all of this. Drawn with
Pillow and its built-in font, so the same inputs give the same bytes.
"""

from __future__ import annotations

import unicodedata
from typing import Callable, Sequence

from PIL import Image, ImageDraw, ImageFont, ImageOps

THUMB = 72          # thumbnail side, pixels
FRAME = 3           # frame width
LINE = 12           # one caption line's height
CAPTION = 2 * LINE + 2  # caption under each thumbnail: two lines
CHARS = 13          # about the characters of a caption line (the built-in font, a thumbnail's width)
ELLIPSIS = ".."     # what stands for the middle of a caption too wide for its tile (ASCII: every font has it)
LEGEND_LINES = ("each row: a query (blue: q <id>, its label), its top retrieved items, then its first positive",
                "+ <label>: same label as the query (green)   x <label>: another label (red)   under each: cosine",
                "#<rank>: the first positive (grey) and its rank")
LEGEND = len(LEGEND_LINES) * LINE + 4  # the legend band above the rows
GAP = 6             # space between tiles
COLOURS = {"query": (31, 119, 180), "hit": (44, 160, 44), "miss": (214, 39, 40), "first": (127, 127, 127)}


def printable(text: object) -> str:
    """``text`` for a caption: control, format (bidi) and line-separator characters shown as ``?``, the rest as is
    (the built-in font draws what it has)."""
    return "".join("?" if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp") else c for c in str(text))


def captions(row: dict) -> list[tuple[str, tuple[str, str]]]:
    """The tiles of one sheet row: (kind, two caption lines) for the query, each retrieved item and the
    first positive (``kind`` is a key of :data:`COLOURS`)."""
    qid, qlabel = row["query"]
    out = [("query", (f"q {printable(qid)}", printable(qlabel)))]
    out += [("hit" if pos else "miss", (f"{'+' if pos else 'x'} {printable(label)}", f"{score:.3f}"))
            for _, label, score, pos in row["retrieved"]]
    if row["first"] is not None:
        _, rank, score = row["first"]
        out.append(("first", (f"#{rank} {printable(qlabel)}", f"{score:.3f}")))
    return out


def fit(text: str, width: float, length: Callable[[str], float]) -> str:
    """``text`` if ``length(text)`` (pixels) fits ``width``; else its start, :data:`ELLIPSIS` and its end, the
    end kept longer (an id's distinguishing tail: ``q images/cat/00123.png`` -> ``q ima..00123.png``)."""
    if length(text) <= width:
        return text
    for keep in range(len(text) - 1, 0, -1):
        head = keep // 3
        cut = text[:head] + ELLIPSIS + text[len(text) - (keep - head):]
        if length(cut) <= width:
            return cut
    return ELLIPSIS


def _tile(image: Image.Image, colour: tuple[int, int, int], lines: Sequence[str], font) -> Image.Image:
    tile = Image.new("RGB", (THUMB + 2 * FRAME, THUMB + 2 * FRAME + CAPTION), "white")
    ImageDraw.Draw(tile).rectangle([0, 0, THUMB + 2 * FRAME - 1, THUMB + 2 * FRAME - 1], fill=colour)
    thumb = ImageOps.pad(image.convert("RGB"), (THUMB, THUMB), method=Image.Resampling.BILINEAR, color="white")
    tile.paste(thumb, (FRAME, FRAME))
    for n, line in enumerate(lines):
        shown = fit(line, THUMB + 2 * FRAME - 2, font.getlength)  # the middle elided, the end kept
        ImageDraw.Draw(tile).text((1, THUMB + 2 * FRAME + 1 + n * LINE), shown, fill=(0, 0, 0), font=font)
    return tile


def draw(rows: Sequence[dict], load: Callable[[str], Image.Image],
         legend: Sequence[str] = LEGEND_LINES) -> Image.Image:
    """The contact sheet of ``rows`` under its legend: each row ``{"query": (id, label), "retrieved": [(id, label,
    score, is_positive)], "first": (id, rank, score) or None}``; ``load(image_id)`` gives an upright image (a text
    <-> image sheet: :func:`text_tile` for a caption id, with :data:`TEXT_IMAGE_LEGEND`)."""
    font = ImageFont.load_default()
    width = max(1, max((2 + len(r["retrieved"]) for r in rows), default=1))
    tile_w, tile_h = THUMB + 2 * FRAME + GAP, THUMB + 2 * FRAME + CAPTION + GAP
    legend_w = max(int(font.getlength(line)) for line in legend) + 2 * GAP
    sheet = Image.new("RGB", (max(width * tile_w + GAP, legend_w), LEGEND + max(1, len(rows)) * tile_h + GAP),
                      "white")
    for n, line in enumerate(legend):
        ImageDraw.Draw(sheet).text((GAP, 2 + n * LINE), line, fill=(0, 0, 0), font=font)
    for y, row in enumerate(rows):
        ids = [row["query"][0]] + [gid for gid, *_ in row["retrieved"]] + \
            ([row["first"][0]] if row["first"] is not None else [])
        for x, (image_id, (kind, lines)) in enumerate(zip(ids, captions(row))):
            tile = _tile(load(image_id), COLOURS[kind], lines, font)
            sheet.paste(tile, (GAP + x * tile_w, LEGEND + GAP + y * tile_h))
    return sheet


#: The legend of a text <-> image sheet (:func:`text_tile` draws a caption where an image would be).
TEXT_IMAGE_LEGEND = ("each row: a query (blue: a caption, drawn as text, or an image), its top retrieved items, then "
                     "its first positive",
                     "+ <image>: the query's own image, or one of its captions (green)   x <image>: another image's "
                     "(red)   under each: cosine",
                     "#<rank>: the first positive (grey) and its rank; under a caption, the image it describes")


def text_tile(text: str, side: int = THUMB) -> Image.Image:
    """A caption drawn as a ``side`` x ``side`` image, word-wrapped with the built-in font; what does not fit
    ends with :data:`ELLIPSIS`."""
    font = ImageFont.load_default()
    image = Image.new("RGB", (side, side), (246, 246, 246))
    lines, line = [], ""
    for word in printable(text).split():
        trial = f"{line} {word}".strip()
        if font.getlength(trial) <= side - 4:
            line = trial
            continue
        if line:
            lines.append(line)
        line = fit(word, side - 4, font.getlength)
    lines.append(line)
    rows = (side - 2) // LINE
    if len(lines) > rows:
        lines = lines[:rows]
        while lines[-1] and font.getlength(lines[-1] + ELLIPSIS) > side - 4:
            lines[-1] = lines[-1][:-1]
        lines[-1] += ELLIPSIS
    for n, text_line in enumerate(lines):
        ImageDraw.Draw(image).text((2, 1 + n * LINE), text_line, fill=(0, 0, 0), font=font)
    return image
