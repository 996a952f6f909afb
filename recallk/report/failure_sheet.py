"""The failure gallery: a contact sheet of the worst queries and what they retrieved (``plots/failures.png``).

One row per query, the worst first (lowest ``ap@r``, then the deepest first positive,
ties by image_id): the query framed blue with its label, its top k retrieved items
framed green (same label) or red (another) with their cosine, then its first positive
framed grey with its rank. Drawn with Pillow and its built-in font, so the same inputs
give the same bytes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
from PIL import Image, ImageDraw, ImageFont, ImageOps

THUMB = 72          # thumbnail side, pixels
FRAME = 3           # frame width
CAPTION = 14        # caption height under each thumbnail
GAP = 6             # space between tiles
COLOURS = {"query": (31, 119, 180), "hit": (44, 160, 44), "miss": (214, 39, 40), "first": (127, 127, 127)}


def worst_queries(per_query: pd.DataFrame, n: int) -> pd.DataFrame:
    """The ``n`` worst queries with a positive: lowest ``ap@r`` (when scored), then the largest
    first-positive rank, ties by image_id."""
    rows = per_query[per_query["first_positive_rank"].notna()].copy()
    rows["_ap"] = rows["ap@r"] if "ap@r" in rows else 0.0
    rows["_rank"] = -rows["first_positive_rank"].astype(np.int64)
    rows = rows.sort_values(["_ap", "_rank", "image_id"], kind="stable")
    return rows.head(n).drop(columns=["_ap", "_rank"])


def _tile(image: Image.Image, colour: tuple[int, int, int], caption: str, font) -> Image.Image:
    tile = Image.new("RGB", (THUMB + 2 * FRAME, THUMB + 2 * FRAME + CAPTION), "white")
    ImageDraw.Draw(tile).rectangle([0, 0, THUMB + 2 * FRAME - 1, THUMB + 2 * FRAME - 1], fill=colour)
    thumb = ImageOps.pad(image.convert("RGB"), (THUMB, THUMB), method=Image.Resampling.BILINEAR, color="white")
    tile.paste(thumb, (FRAME, FRAME))
    ImageDraw.Draw(tile).text((1, THUMB + 2 * FRAME + 1), caption[:14], fill=(0, 0, 0), font=font)
    return tile


def draw(rows: Sequence[dict], load: Callable[[str], Image.Image]) -> Image.Image:
    """The contact sheet of ``rows``: each ``{"query": (id, label), "retrieved": [(id, label, score,
    is_positive)], "first": (id, rank, score) or None}``; ``load(image_id)`` gives an upright image."""
    font = ImageFont.load_default()
    width = max(1, max((2 + len(r["retrieved"]) for r in rows), default=1))
    tile_w, tile_h = THUMB + 2 * FRAME + GAP, THUMB + 2 * FRAME + CAPTION + GAP
    sheet = Image.new("RGB", (width * tile_w + GAP, max(1, len(rows)) * tile_h + GAP), "white")
    for y, row in enumerate(rows):
        qid, qlabel = row["query"]
        tiles = [_tile(load(qid), COLOURS["query"], f"q {qlabel}", font)]
        tiles += [_tile(load(gid), COLOURS["hit" if pos else "miss"], f"{score:.3f}", font)
                  for gid, _, score, pos in row["retrieved"]]
        if row["first"] is not None:
            gid, rank, score = row["first"]
            tiles.append(_tile(load(gid), COLOURS["first"], f"#{rank} \u00b7 {score:.3f}", font))
        for x, tile in enumerate(tiles):
            sheet.paste(tile, (GAP + x * tile_w, GAP + y * tile_h))
    return sheet
