"""What a backbone is: a pure batch encoder and a fingerprint of everything its output depends on.

A :class:`Backbone` wraps ``encode(images) -> (n, dim) float32``, a pure function
over a list of upright RGB :class:`PIL.Image.Image`, plus a ``fingerprint`` that
changes whenever its output could change (code version, weights, preprocessing
params, the image decoder and the background it composites transparency over, and the
libraries). The embedding cache keys on it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import PIL
from PIL import Image

from recallk.images import DECODE_VERSION, DEFAULT_BACKGROUND, background_hex


@dataclass(frozen=True)
class Backbone:
    """A named batch encoder, its output dimension and its fingerprint."""

    name: str
    dim: int | None  # None: known after the first batch (a user callable)
    encode: Callable[[Sequence[Image.Image]], np.ndarray]
    fingerprint: str
    input_size: int | None = None  # side the backbone resizes to; loaders may decode JPEGs at reduced size down to it
    user_code: bool = False  # a user's callable: whatever it raises (even sys.exit) is a message, not a traceback
    #: The colour the encode stage composites its images' transparency over (``split.background``, the value
    #: split hashed them with); part of ``fingerprint`` (:func:`composited_over`).
    background: str = DEFAULT_BACKGROUND
    #: The text tower of a CLIP-style model: ``captions -> (n, dim)`` float32 in the image embeddings' space;
    #: None for an image-only backbone.
    encode_text: Callable[[Sequence[str]], np.ndarray] | None = None
    #: What the text embeddings depend on: the model's :attr:`fingerprint` (weights, runtime) and the
    #: tokenizer (its kind, vocabulary hash and context length). None without a text tower.
    text_fingerprint: str | None = None


def fingerprint(name: str, version: str, **options: Any) -> str:
    """A short stable hash of a backbone's name, code version, preprocessing options and image decoder.

    The installed Pillow and numpy versions are part of it too, so upgrading them
    (which can move pixels by a rounding step) never serves stale cached vectors.
    """
    libs = {"pillow": PIL.__version__, "numpy": np.__version__}
    blob = json.dumps({"name": name, "version": version, "options": options, "decode": DECODE_VERSION,
                       "libs": libs}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def text_fingerprint(image_fingerprint: str, tokenizer: dict[str, Any]) -> str:
    """The :attr:`Backbone.text_fingerprint` of a model whose image fingerprint is ``image_fingerprint`` and
    whose tokenizer is described by ``tokenizer`` (JSON-able: kind, vocabulary sha256, context length)."""
    blob = json.dumps({"model": image_fingerprint, "tokenizer": tokenizer}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def composited_over(backbone: Backbone, background: str) -> Backbone:
    """``backbone`` fed images whose transparency is composited over ``background`` (a ``split.background``
    value): its fingerprint covers the colour, as the pixels it sees depend on it. The default, white, is what
    :data:`~recallk.images.DECODE_VERSION` 4 (in every fingerprint) decodes, so it leaves the fingerprint as the
    backbone made it; any other colour is hashed in, by its ``#rrggbb`` (``white`` and ``"#FFFFFF"`` are one
    colour and share cached embeddings). Every backbone the encode stage builds goes through here
    (:func:`recallk.encode.registry.get_backbone`)."""
    colour = background_hex(background)
    if colour == background_hex(DEFAULT_BACKGROUND):
        return dataclasses.replace(backbone, background=background)
    blob = json.dumps({"backbone": backbone.fingerprint, "background": colour}, sort_keys=True)
    return dataclasses.replace(backbone, background=background,
                               fingerprint=hashlib.sha256(blob.encode()).hexdigest()[:16])


@dataclass(frozen=True)
class ModelSpec:
    """What names a model backbone and what its fingerprint covers besides where it runs: its ``name``,
    code ``version`` (bumped when the output may change), ``options`` (weights hashes, the resolved
    preprocessing, ...) and the ``libraries`` (distribution names) whose installed versions count."""

    name: str
    version: str
    options: dict[str, Any]
    libraries: Sequence[str] = ()

    def fingerprint(self, runtime: dict[str, Any]) -> str:
        """:func:`fingerprint` of the model and its ``runtime`` fields (library versions, device)."""
        return fingerprint(self.name, self.version, **self.options, runtime=runtime)


#: The default of every encode param naming a file that DVC tracks (``encode.precomputed.path``,
#: ``encode.timm.weights``, ...): a committed file standing for "no file", as DVC cannot track null.
NO_FILE = "recallk/encode/no_file.txt"


def is_no_file(path: str | None) -> bool:
    """Whether ``path`` is :data:`NO_FILE` (by name, so from any working directory)."""
    return path is not None and Path(path).name == Path(NO_FILE).name


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of the file at ``path``, read 1 MiB at a time (weights, embedding files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
