"""The ``encode`` section: :class:`EncodeSettings`, its sub-sections (the Ray engine, each backbone's
options) and the rules only this section has (a path DVC tracks, GPUs per actor, channel triples)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any

from recallk.checks import bool_problem, choice, integer, is_int, name_problem, optional
from recallk.encode.base import NO_FILE
from recallk.encode.device import DEVICES, DTYPES
from recallk.encode.verify import SAMPLE
from recallk.errors import quote
from recallk.settings.base import as_params, ray_address, setting

#: ``encode.hf.pooling``: what of a transformers model's outputs is the embedding (recallk.encode.backbones.hf).
POOLINGS = ("cls", "mean", "pooler")
#: ``encode.torchvision.interpolation``: torchvision's InterpolationMode values the explicit preprocessing takes.
INTERPOLATIONS = ("bilinear", "bicubic", "nearest")
#: The sub-sections holding a backbone's options (``encode.<backbone>``; recallk.encode.registry.options_key).
BACKBONE_SECTIONS = ("pixels", "precomputed", "callable", "timm", "open_clip", "torchvision", "hf")


def tracked_path_problem(v: Any) -> str | None:
    """A path param the encode stage depends on in dvc.yaml (``${encode.<...>}``): never null (DVC cannot
    track it; :data:`~recallk.encode.base.NO_FILE` stands for none), never a ``local-dir:`` spec."""
    if not isinstance(v, str) or not v.strip():
        return (f"must be a path: the encode stage depends on it in dvc.yaml, so that replacing the file re-runs "
                f"encode, and DVC cannot track null. Keep {NO_FILE} (none) when it is not used; on the command "
                f"line too, `dvc exp run -S <this key>={NO_FILE}`, as `=null` or `=\"\"` stops DVC itself with "
                f"\"unexpected error\" (treeverse/dvc#8036). Got {quote(v)} instead.")
    if v.startswith("local-dir:"):
        return (f"is a path DVC tracks, and DVC reads {quote(v)} as a file of that name; write the folder "
                f"itself, {quote(v[len('local-dir:'):])} (a folder is read as a local-dir: config and weights).")
    return None


def tracked_file(doc: str) -> Any:
    """A path field the encode stage depends on in dvc.yaml (``${encode.<sub>.<key>}``): the committed placeholder
    :data:`~recallk.encode.base.NO_FILE` by default (none), by the one rule :func:`tracked_path_problem`."""
    return setting(NO_FILE, tracked_path_problem, doc)


def gpus_problem(v: Any) -> str | None:
    """GPUs per Ray actor: a number from 0 to 64 (fractions share a GPU)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 64 or math.isnan(v):
        return (f"must be a number of GPUs per actor between 0 and 64 (0: CPU only; 0.5: two actors per GPU). "
                f"Got {quote(v)} instead.")
    return None


def channels_problem(v: Any) -> str | None:
    """One finite number per colour channel (R, G, B)."""
    if (not isinstance(v, list) or len(v) != 3
            or not all((is_int(x) or isinstance(x, float)) and math.isfinite(x) for x in v)):
        return f"must be a list of 3 numbers (R, G, B), such as [0.485, 0.456, 0.406]. Got {quote(v)} instead."
    return None


#: The rule of ``open_clip.tag`` and ``torchvision.preset``: a name, or null.
optional_name = partial(name_problem, optional=True)

TRACKED = ("A DVC dependency of encode, so replacing the file re-runs encode and score; the default is a committed "
           "placeholder for \"none\" (DVC cannot track `null`)")


@dataclass(frozen=True)
class EncodeRaySettings:
    """``encode.ray``: the Ray Data actors of ``encode.engine: ray`` (docs/internals/scale.md)."""

    address: str | None = ray_address("cluster address (`ray://head:10001`, `auto`); `null`: `RAY_ADDRESS`, else a "
                                      "local cluster")
    concurrency: int = setting(2, integer(1, 4096), "encoder actors; each builds the backbone once")
    num_gpus: float = setting(0, gpus_problem, "GPUs per actor (0: one CPU each; 0.5: two actors share a GPU)")
    batch_size: int = setting(64, integer(1, 65536), "images per backbone call and per Ray block")


@dataclass(frozen=True)
class PixelsSettings:
    """``encode.pixels``: the baseline with no learned weights."""

    resolution: int = setting(16, integer(1, 1024),
                              "`pixels`: images resized (bilinear) to `resolution × resolution` RGB, scaled to [0, 1]")


@dataclass(frozen=True)
class PrecomputedSettings:
    """``encode.precomputed``: embeddings made elsewhere (both paths are DVC deps of encode)."""

    path: str = tracked_file(f"`precomputed`: an `.npz` with arrays `ids` and `embeddings`, or an `.npy` of "
                             f"embeddings. {TRACKED}")
    ids: str = tracked_file("with an `.npy` path: the aligned ids, an `.npy` of strings or a `.txt` (UTF-8, one id per "
                            "line). A DVC dependency too (placeholder for \"none\": an `.npz` holds its ids)")
    text: str = tracked_file("with captions (`split.captions`): an `.npz` with arrays `ids` (caption ids, "
                             "`<image_id>#<n>` as in `data/prepared/captions.csv`) and `embeddings` (the images' "
                             "dimension). A DVC dependency too (placeholder for \"none\")")


@dataclass(frozen=True)
class CallableSettings:
    """``encode.callable``: the module of a ``callable:`` backbone (a DVC dep, like the weights)."""

    module_file: str = tracked_file("with `backbone: callable:...`: the module's file (or a folder holding it, for "
                                    "a package). A DVC dependency, so editing the module re-runs encode; the stage "
                                    "refuses a callable whose source is elsewhere")
    text_function: str | None = setting(None, optional_name,
                                        "with captions: a function of the same module, `list[str] -> (n, d)` array "
                                        "in the images' space, that embeds them; `null`: the callable embeds no text")


@dataclass(frozen=True)
class TimmSettings:
    """``encode.timm``: ``timm:<model>``'s weights."""

    weights: str = tracked_file("`timm:<model>`: a weights file, or a folder with timm's `config.json` + weights; a "
                                "DVC dependency of encode (the placeholder: timm's pretrained file from the local "
                                "Hugging Face cache)")


@dataclass(frozen=True)
class OpenClipSettings:
    """``encode.open_clip``: ``open_clip:<config>``'s checkpoint and pretrained tag."""

    weights: str = tracked_file("`open_clip:<config>`: a checkpoint file, or a folder with `open_clip_config.json` + "
                                "weights; a DVC dependency of encode")
    tag: str | None = setting(None, optional_name,
                              "with a checkpoint file: the pretrained tag it was published as, whose preprocessing "
                              "applies ([docs/backbones.md](backbones.md))")


@dataclass(frozen=True)
class TorchvisionSettings:
    """``encode.torchvision``: ``torchvision:<model>``'s state dict and preprocessing, from a weights enum
    member (``preset``) or, when it is null, from all of resize/crop/mean/std (there is no default)."""

    weights: str = tracked_file("`torchvision:<model>`: the whole classification model's state dict "
                                "(`.pth`/`.pt`/`.bin`/`.safetensors`); a DVC dependency of encode")
    preset: str | None = setting(None, optional_name,
                                 "a weights enum member (`<Enum>.<member>`), resolved offline; its transform is used")
    resize: int | None = setting(None, optional(integer(1, 8192)),
                                 "without a preset: the shorter side, in pixels")
    crop: int | None = setting(None, optional(integer(1, 8192)),
                               "without a preset: the center crop after the resize, in pixels")
    mean: tuple[float, ...] | None = setting(None, optional(channels_problem),
                                             "without a preset: 3 numbers, on the [0, 1] scale")
    std: tuple[float, ...] | None = setting(None, optional(channels_problem),
                                            "without a preset: 3 numbers, on the [0, 1] scale")
    interpolation: str = setting("bilinear", choice(*INTERPOLATIONS),
                                 "without a preset: `bilinear`, `bicubic` or `nearest` (antialiased)")


@dataclass(frozen=True)
class HfSettings:
    """``encode.hf``: ``hf:<dir>``'s directory (here too, so that DVC tracks the model's files) and pooling."""

    dir: str = tracked_file("`hf:<dir>`: the same directory (config, weights, processor config), so that it is a DVC "
                            "dependency of encode")
    pooling: str = setting("cls", choice(*POOLINGS),
                           "`cls`: `last_hidden_state[:, 0]`; `mean`: mean of `last_hidden_state` over all tokens; "
                           "`pooler`: `pooler_output`")


@dataclass(frozen=True)
class EncodeSettings:
    """The ``encode`` section: the backbone and its options (``encode.<backbone>.<option>``), the batches,
    where the cache misses are encoded (``engine``) and how torch backbones run (``device``, ...)."""

    backbone: str = setting("pixels", name_problem,
                            "`pixels`, `efficientnet_lite0`, `timm:<model>`, `open_clip:<model>`, "
                            "`torchvision:<model>`, `hf:<dir>`, `precomputed` or `callable:package.module:function` "
                            "([Backbones](backbones.md))")
    batch_size: int = setting(64, integer(1, 65536), "images per call of the backbone")
    num_workers: int = setting(2, integer(1, 256),
                               "threads decoding images ahead of the backbone (at most 2 batches ahead)")
    engine: str = setting("local", choice("local", "ray"),
                          "`local`: this process; `ray`: encode the cache misses on Ray Data actors, the same bytes "
                          "([docs/internals/scale.md](internals/scale.md))")
    ray: EncodeRaySettings = setting(EncodeRaySettings)
    pixels: PixelsSettings = setting(PixelsSettings)
    precomputed: PrecomputedSettings = setting(PrecomputedSettings)
    callable: CallableSettings = setting(CallableSettings)
    timm: TimmSettings = setting(TimmSettings)
    open_clip: OpenClipSettings = setting(OpenClipSettings)
    torchvision: TorchvisionSettings = setting(TorchvisionSettings)
    hf: HfSettings = setting(HfSettings)
    device: str = setting("auto", choice(*DEVICES),
                          "torch backbones: `auto` (cuda when torch sees a GPU, else cpu), `cpu` or `cuda` "
                          "([docs/internals/gpu.md](internals/gpu.md))")
    dtype: str = setting("float32", choice(*DTYPES),
                         "torch backbones: `float32`, `bfloat16` or `float16` (GPU only)")
    reproducible: bool = setting(True, bool_problem,
                                 "torch backbones on a GPU: deterministic CUDA kernels with TF32 off")
    verify_cache: int = setting(SAMPLE, integer(0, 1_000_000),
                                "cache hits encoded again each run (a deterministic sample, keyed by the cache's "
                                "secret) and compared with the cached vectors: a difference above 1% of the largest "
                                "value fails the stage. 0: off "
                                "([the trust boundary](backbones.md#the-embedding-cache))")

    def backbone_options(self, key: str) -> dict[str, Any] | None:
        """The options of the backbone whose sub-section is ``key`` (:func:`recallk.encode.registry.options_key`)
        as a mapping, or None when it has none (``efficientnet_lite0``)."""
        return as_params(getattr(self, key)) if key in BACKBONE_SECTIONS else None
