"""Captions for text <-> image retrieval (``split.captions``, ``split.protocol: text_image``).

The captions file is a CSV inside the data root with columns ``image_id,caption``, one row per caption (an image
may have several, as MSCOCO's and Flickr30k's five). :func:`read_captions` reads it as text and
:func:`caption_table` checks it against the catalog (:func:`recallk.data.contract.caption_source_schema`: every
refusal lists its rows) and gives the captions table the split stage writes
(``caption_id, image_id, caption, split``; :func:`recallk.data.contract.captions_schema`), in file order, with
``caption_id`` = ``<image_id>#<n>`` (``n``: the 0-based order of that image's captions in the file). Captions of
an image the split skipped (``split.on_bad_image: skip``) are dropped and counted; captions of train images are
kept (counted, not scored). An exact caption that describes two eval images makes a text query ambiguous (only
one of them is its positive): such captions are counted and a few named in a warning.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from recallk.data import catalog, contract
from recallk.errors import InputError, clip, quote

log = logging.getLogger(__name__)

#: The columns of the captions table (``data/prepared/captions.csv``), in order.
CAPTION_COLUMNS = ("caption_id", "image_id", "caption", "split")
#: The columns a captions file must have.
SOURCE_COLUMNS = ("image_id", "caption")
#: Ambiguous captions the warning names before it summarises the rest.
MAX_NAMED = 5


def empty_table() -> pd.DataFrame:
    """The captions table without captions (header only): what the split stage writes when ``split.captions``
    is null."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in CAPTION_COLUMNS})


def read_captions(root: Path, name: str) -> pd.DataFrame:
    """The captions file ``name`` (inside ``root``, the data root) as text: ``image_id, caption`` in file order,
    indexed from 0 (row ``i`` is CSV line ``i + 2``). Nothing is stripped or judged here but the file itself:
    where it is, its encoding, its header and that it has rows."""
    path, frame = catalog.read_text_csv(root, name, "captions", "captions file")
    missing = [c for c in SOURCE_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"captions file {quote(str(path))} lacks column(s) {', '.join(missing)}; it needs a header "
                         f"image_id,caption (one row per caption). Found: {', '.join(map(clip, frame.columns))}.")
    if frame.empty:
        raise InputError(f"captions file {quote(str(path))} has no rows; list one caption per row "
                         "(image_id,caption).")
    return frame[list(SOURCE_COLUMNS)].reset_index(drop=True)


def caption_table(raw: pd.DataFrame, split: pd.DataFrame, skipped_ids: set[str],
                  source: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The captions table of ``raw`` (:func:`read_captions`) for the images of ``split`` (``image_id, split``:
    the split table), and its counts for provenance.json.

    Captions of ``skipped_ids`` (images the split dropped as unreadable) are dropped and counted; every other
    row must name an image of ``split`` and hold one non-blank line of text (one InputError listing every
    failing row, by ``source``'s CSV line). At least one caption must describe an eval image (val or gallery).
    """
    skipped = raw["image_id"].isin(skipped_ids)
    if skipped.any():
        log.warning("dropped %d caption(s) of %d skipped image(s) (split.on_bad_image: skip), e.g. %s",
                    int(skipped.sum()), raw.loc[skipped, "image_id"].nunique(),
                    ", ".join(map(quote, raw.loc[skipped, "image_id"].unique()[:3])))
    kept = raw[~skipped]
    contract.validate(kept, contract.caption_source_schema(set(split["image_id"])), source=source, csv_lines=True)
    kept = kept.reset_index(drop=True)
    n = kept.groupby("image_id", sort=False).cumcount().astype(str)
    image_split = dict(zip(split["image_id"], split["split"]))
    table = pd.DataFrame({"caption_id": kept["image_id"] + "#" + n, "image_id": kept["image_id"],
                          "caption": kept["caption"], "split": kept["image_id"].map(image_split)})
    contract.validate(table, contract.captions_schema(), source="the captions table", csv_lines=True)
    scored = table[table["split"].isin(contract.EVAL_SPLITS)]
    if scored.empty:
        raise InputError(f"none of the {len(table)} captions of {source} describes an eval image (val or gallery): "
                         "they are all of train images, so there is nothing to score. Caption the eval images, or "
                         "change `split.fractions` (or the manifest's split column) so that captioned images are "
                         "evaluated.")
    ambiguous = ambiguous_captions(scored)
    summary = {"num_captions": len(table), "num_captioned_images": int(table["image_id"].nunique()),
               "num_eval_captions": len(scored), "num_ambiguous_captions": int(ambiguous.sum()),
               "num_skipped_captions": int(skipped.sum())}
    log.info("captions: %d of %d images (%d captions, %d of eval images, scored)", summary["num_captioned_images"],
             len(split), len(table), len(scored))
    return table, summary


def ambiguous_captions(scored: pd.DataFrame) -> pd.Series:
    """Rows of ``scored`` (eval captions) whose exact text is also a caption of another image: as a text -> image
    query such a caption has one positive, its own image, while another image fits it as well. Warned, naming the
    first :data:`MAX_NAMED` texts and their images."""
    images = scored.groupby("caption", sort=False)["image_id"].unique()
    shared = images[images.map(len) > 1]
    flags = scored["caption"].isin(shared.index)
    if flags.any():
        named = [f"{quote(text)} ({', '.join(map(quote, ids[:3]))}{' ...' if len(ids) > 3 else ''})"
                 for text, ids in shared.head(MAX_NAMED).items()]
        more = f" and {len(shared) - MAX_NAMED} more text(s)" if len(shared) > MAX_NAMED else ""
        log.warning("%d caption(s) of eval images are the exact text of a caption of another eval image: %s%s. As a "
                    "text -> image query each counts only its own image as a hit though the others fit it too "
                    "(num_ambiguous_captions in data/prepared/provenance.json); make them tell the images apart, "
                    "or drop the copies", int(flags.sum()), "; ".join(named), more)
    return flags
