"""What was evaluated: the provenance lines of the report and the id every report table carries."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def provenance(split: dict[str, Any] | None, encode: dict[str, Any] | None, score: dict[str, Any]) -> dict[str, str]:
    """What was evaluated, one line each: the backbone and its fingerprint, the data, how transparency was shown
    (the background, and how many images it changed), the split and the score settings; ``split`` / ``encode`` are
    those stages' ``provenance.json`` (None: unknown)."""
    out: dict[str, str] = {}
    if encode:
        out["backbone"] = f"{encode['backbone']} (fingerprint {encode['fingerprint']}, dim {encode['embedding_dim']})"
    if split:
        manifest = f", manifest {split['manifest']}" if split.get("manifest") else ""
        out["data"] = (f"{split['data_root']}{manifest}: {split['num_images']} images, {split['num_labels']} labels, "
                       f"{split['num_skipped_images']} skipped")
        if split.get("images") != "none" and split.get("background"):  # a split that predates it: no line
            out["transparency"] = (f"{split.get('num_transparent_images')} of {split['num_images']} images have "
                                   f"transparency, composited over {split['background']} (split.background)")
        out["split"] = f"{split['strategy']}, {split['protocol']}, seed {split['seed']}"
        if split.get("benchmark"):  # a `recallk datasets prepare` manifest: the standard protocol, by name
            sizes = ", ".join(f"{v:,} {k}" for k, v in split["benchmark"]["sizes"].items())
            out["benchmark"] = f"{split['benchmark']['name']} ({sizes})"
        if split.get("captions"):  # text <-> image: the captions file and its counts
            out["captions"] = caption_line(split)
        nd = split.get("near_duplicates")
        if split.get("images") == "none":
            out["near-dups"] = "unavailable (embeddings-only catalog: no image files to compare)"
        elif nd:
            small = nd.get("too_small_to_check")  # images under 16 px a side (recallk.data.nearcopy)
            out["near-dups"] = (f"pHash within {nd['max_distance']} of 64 bits, policy {nd['policy']}: "
                                f"{nd['pairs']} pair(s) (data/prepared/near_duplicates.csv)"
                                + (f"; {small} of {split['num_images']} images too small to check" if small else ""))
    min_cosine = (score.get("embedding_copies") or {}).get("min_cosine")
    if min_cosine is not None:
        backbone = f"{encode['backbone']} embeddings" if encode else "the embeddings"
        out["near-copies"] = (f"queries with another image at cosine >= {min_cosine:g} in {backbone} "
                              "(data/scores/embedding_copies.csv)")
    boot = score["bootstrap"]
    # text <-> image: resampled by image, each with its captions (recallk.score.crossmodal.crossmodal_intervals)
    text_image = (split or {}).get("protocol") == "text_image"
    intervals = (f"{boot['resamples']} bootstrap resamples by "
                 f"{'image (with its captions)' if text_image else boot['unit']}, {boot['confidence']:.0%}"
                 if boot["resamples"] else "off")
    rules = "".join(f", {k} {score[k]}" for k in OPTIONAL_WHAT if score.get(k))
    out["scoring"] = (f"exclude_same {list(score['exclude_same'])}{rules}, whiten {score['whiten']}, "
                      f"backend {score['backend']}, intervals {intervals}")
    out["id"] = evaluation_id(split, encode, score)
    return out


def caption_line(split: dict[str, Any]) -> str:
    """The ``captions:`` line of a split with captions (its provenance.json): how many, of how many images, how many
    of eval images (scored), and how many are ambiguous (the exact text of another eval image's caption)."""
    skipped = split.get("num_skipped_captions") or 0
    return (f"{split['captions']}: {split['num_captions']} captions of {split['num_captioned_images']} images, "
            f"{split.get('num_eval_captions', split['num_captions'])} of eval images scored, "
            f"{split['num_ambiguous_captions']} ambiguous (the exact text of another eval image's caption)"
            + (f", {skipped} of skipped images dropped" if skipped else ""))


#: The split provenance's caption keys (``split.captions`` and its counts): hashed into :func:`evaluation_id` only
#: when captions are set, so the ids of runs without them stay as they were.
CAPTION_KEYS = ("captions", "num_captions", "num_captioned_images", "num_eval_captions", "num_ambiguous_captions",
                "num_skipped_captions")


#: Score params that decide what the tables measure (the others decide how it is computed, the
#: intervals or the failure gallery, and never change a table's numbers): the score part of :func:`evaluation_id`.
WHAT = ("ks", "metrics", "exclude_same", "whiten", "embedding_copies")
#: Score params that decide what is measured too, hashed only when set (so the ids of runs without them stay
#: as they were): the joint exclusion and the junk column (:mod:`recallk.score.exclusion`).
OPTIONAL_WHAT = ("exclude_same_all", "junk")


def evaluation_id(split: dict[str, Any] | None, encode: dict[str, Any] | None, score: dict[str, Any]) -> str:
    """A short id (12 hex digits) of what was evaluated: sha256 over the split and encode stages'
    provenance (data, split, backbone fingerprint) and the score params that decide what is measured
    (:data:`WHAT`; not ``backend``, ``max_memory_mb``, ``bootstrap`` or ``failures``). Every report CSV
    carries it in its last column ``evaluated`` and
    ``metrics/evaluated.json`` under ``id``, so a table found on its own says what it measured."""
    if split and not split.get("captions"):
        split = {k: v for k, v in split.items() if k not in CAPTION_KEYS}
    blob = json.dumps({"split": split, "encode": encode,
                       "score": {**{k: score.get(k) for k in WHAT},
                                 **{k: score[k] for k in OPTIONAL_WHAT if score.get(k)}}},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]
