"""The ``split`` section: :class:`SplitSettings` and its sub-sections (near-duplicates, fractions)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import partial

from recallk.checks import choice, fraction_problem, integer, path_problem
from recallk.errors import quote
from recallk.images import DEFAULT_BACKGROUND, background_problem
from recallk.settings.base import setting

#: ``split.protocol``: who queries whom among the eval images (:func:`recallk.data.splitting.roles`).
TEXT_IMAGE = "text_image"
PROTOCOLS = ("query_gallery", "leave_one_out", TEXT_IMAGE)

#: Largest `split.near_duplicates.max_distance` (of 64 bits): beyond it unrelated photos match and the search slows.
MAX_HAMMING = 16


@dataclass(frozen=True)
class NearDuplicateSettings:
    """``split.near_duplicates``: the pHash pairs of the catalog and what to do with them."""

    policy: str = setting("report", choice("report", "group", "error"),
                          "image pairs whose pHash differ in at most `max_distance` bits: `report` lists and counts "
                          "them; `group` keeps each cluster in one split; `error` stops on a pair across the split "
                          "([Leakage checks](leakage.md))")
    max_distance: int = setting(10, integer(0, MAX_HAMMING),
                                f"Hamming distance of 64 bits, 0 to {MAX_HAMMING} (0: equal hashes only)")


@dataclass(frozen=True)
class FractionSettings:
    """``split.fractions``: the shares of train, val and gallery (they sum to 1)."""

    train: float = setting(0.5, fraction_problem,
                           "`class_disjoint`: share of labels in train (a pretrained backbone never uses them: set it "
                           "to `0` to evaluate on every label); `per_class`: share of each label's images")
    val: float = setting(0.25, fraction_problem,
                         "`class_disjoint`: each eval label's images go to val queries and gallery in the ratio val : "
                         "gallery (the defaults give half each); `per_class`: share of each label's images")
    gallery: float = setting(0.25, fraction_problem,
                             "the rest; the three sum to 1; under `leave_one_out` and `text_image` val and "
                             "gallery merge")

    def problem(self) -> str | None:
        """The three must sum to 1 (within 1e-9)."""
        parts = [getattr(self, f.name) for f in fields(self)]
        total = math.fsum(parts)
        if not math.isclose(total, 1.0, abs_tol=1e-9):
            # the fewest digits (at least 6) that do not round the sum to 1: 1.0000001 is not "1"
            shown = next(t for p in range(6, 18) if float(t := f"{total:.{p}g}") != 1.0 or p == 17)
            return (f"train + val + gallery must sum to 1. Got {shown} instead. "
                    f"({' + '.join(map(repr, parts))})")
        return None


@dataclass(frozen=True)
class SplitSettings:
    """The ``split`` section: where the images are, how they are split, and the near-duplicate check."""

    data_root: str = setting("data/digits", path_problem, "folder holding the images (also a DVC dep of the stage)")
    csv: str | None = setting(None, partial(path_problem, optional=True),
                              "manifest CSV inside `data_root`; `null` = one folder per label")
    on_bad_image: str = setting("error", choice("error", "skip"),
                                "an unreadable image: `error` lists them all; `skip` drops them into "
                                "`data/prepared/skipped.csv`")
    strategy: str = setting("class_disjoint", choice("class_disjoint", "per_class", "given"),
                            "`class_disjoint`: labels go to train or eval; `per_class`: each label's images split; "
                            "`given`: the CSV's `split` column")
    protocol: str = setting("query_gallery", choice(*PROTOCOLS),
                            "`query_gallery`: val queries against the gallery; `leave_one_out`: every eval image "
                            "against all others; `text_image`: text <-> image retrieval over the eval images and "
                            "their captions (needs `captions`; [text <-> image](data.md#text--image))")
    seed: int = setting(0, integer(0), "seed of the stable hash that orders labels and files")
    images: str = setting("auto", choice("auto", "files", "none"),
                          "`auto`: a manifest without a `path` column is a list of ids (embeddings-only); `files`: "
                          "every manifest row needs an image file; `none`: never read images (a `path` column is "
                          "ignored)")
    background: str = setting(DEFAULT_BACKGROUND, background_problem,
                              "the colour transparency (alpha, LA, palette) is composited over, in split's pHash "
                              "and encode's pixels (a params dep of encode too): `white`, `black` or `\"#rrggbb\"` "
                              "(quoted); white as transformers' image processors do, where timm, torchvision and "
                              "open_clip loaders drop the alpha ([transparent images](data.md#transparent-images))")
    captions: str | None = setting(None, partial(path_problem, optional=True),
                                   "captions CSV inside `data_root` (`image_id,caption`, one row per caption) for "
                                   "`protocol: text_image`; `null`: none ([text <-> image](data.md#text--image))")
    near_duplicates: NearDuplicateSettings = setting(NearDuplicateSettings)
    fractions: FractionSettings = setting(FractionSettings)

    def problem(self) -> str | None:
        """Captions and ``protocol: text_image`` go together: one without the other is refused."""
        if self.captions is not None and self.protocol != TEXT_IMAGE:
            return (f"`captions` is {quote(self.captions)}, but `protocol` is {quote(self.protocol)}: captions are "
                    f"scored only under `protocol: {TEXT_IMAGE}` (text <-> image retrieval). Set `split.protocol: "
                    f"{TEXT_IMAGE}`, or `split.captions: null` to evaluate image retrieval.")
        if self.captions is None and self.protocol == TEXT_IMAGE:
            return (f"`protocol` is {TEXT_IMAGE}, which scores captions against images, but `captions` is null. "
                    "Set `split.captions` to a CSV inside `split.data_root` with columns image_id,caption (one row "
                    "per caption), or choose `protocol: query_gallery` or `leave_one_out`.")
        return None
