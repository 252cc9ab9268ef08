"""The model corpus ``tune`` and ``quantize`` are tested on (issue 26): models exported here with
torch, seeded random weights, low resolution (64x64), a few MB at most, and the built-in assets.

Torch models (:data:`TORCH_MODELS`), each written as a model folder ``<name>/1/model.onnx``
(+ ``config.yaml`` where the file alone does not say how it batches) by :func:`build_model`:

* ``resnet18-o11`` / ``-o13`` / ``-o17``: a ResNet-18 (BasicBlock x [2, 2, 2, 2], widths 16-128
  instead of 64-512), ``x`` float32 ``[1, 3, 64, 64]`` NCHW -> ``logits`` ``[1, 10]``; the o17
  one has a dynamic batch (``max_batch_size: 8``), the others a fixed batch of 1;
* ``mobilenetv3-o11`` / ``-o13`` / ``-o17``: a MobileNetV3-Small-like net (inverted residuals
  with squeeze-excite, Hardswish/Hardsigmoid, widths 16-48), same input and output; the o17 one
  has a dynamic batch and a dynamic height and width (``[N, 3, H, W]``);
* ``two-in-three-out`` (opset 17, dynamic batch): ``image`` ``[N, 3, 64, 64]`` and ``meta``
  ``[N, 8]`` -> ``logits`` ``[N, 10]``, ``embedding`` ``[N, 16]``, ``mask`` ``[N, 1, 16, 16]``;
* ``superres-x2`` (opset 17, dynamic height/width, ESPCN-shaped: convolutions and a
  PixelShuffle): ``lr`` ``[1, 3, H, W]`` -> ``hr`` ``[1, 3, 2H, 2W]`` in ``[0, 1]``.

Built-in models (:data:`BUILTIN_MODELS`): ``frameserve.assets.BUILTIN_MODELS``, fetched by the
tests' ``real_asset`` fixture, written with their built-in config by :func:`builtin_folder`.

Importing this module needs no torch; :func:`build_model` does (tests skip without it).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

__all__ = [
    "BUILTIN_MODELS",
    "TORCH_MODELS",
    "CorpusModel",
    "build_model",
    "builtin_folder",
    "calibration_images",
    "calibration_npz",
    "torch_available",
]

SEED = 26
SIZE = 64


@dataclass(frozen=True)
class CorpusModel:
    """One torch-exported corpus model.

    Attributes:
        name: the model folder's name.
        net: ``resnet18``, ``mobilenetv3``, ``two_in_three_out`` or ``superres``.
        opset: the ONNX opset it is exported at.
        dynamic_batch: the batch dim is variable (config ``max_batch_size: 8``).
        dynamic_hw: height and width are variable.
        kind: what the gate should measure it as: ``scores`` (a classifier) or ``tensors``.
    """

    name: str
    net: str
    opset: int
    dynamic_batch: bool = False
    dynamic_hw: bool = False
    kind: str = "tensors"


TORCH_MODELS: tuple[CorpusModel, ...] = (
    CorpusModel("resnet18-o11", "resnet18", 11),
    CorpusModel("resnet18-o13", "resnet18", 13),
    CorpusModel("resnet18-o17", "resnet18", 17, dynamic_batch=True),
    CorpusModel("mobilenetv3-o11", "mobilenetv3", 11),
    CorpusModel("mobilenetv3-o13", "mobilenetv3", 13),
    CorpusModel("mobilenetv3-o17", "mobilenetv3", 17, dynamic_batch=True, dynamic_hw=True),
    CorpusModel("two-in-three-out", "two_in_three_out", 17, dynamic_batch=True),
    CorpusModel("superres-x2", "superres", 17, dynamic_hw=True),
)

BUILTIN_MODELS: tuple[str, ...] = (
    "nudenet",
    "opennsfw",
    "ppocr-det",
    "ppocr-cls",
    "ppocr-rec",
    "mtcnn-pnet",
    "mtcnn-rnet",
    "mtcnn-onet",
)


def torch_available() -> bool:
    """Whether torch imports (the torch corpus is built with it)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def _nets() -> dict[str, Callable[[], Any]]:
    import torch
    from torch import nn

    class Basic(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.b1 = nn.BatchNorm2d(cout)
            self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.b2 = nn.BatchNorm2d(cout)
            self.down = (
                None
                if stride == 1 and cin == cout
                else nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            )

        def forward(self, x: Any) -> Any:
            y = torch.relu(self.b1(self.c1(x)))
            y = self.b2(self.c2(y))
            return torch.relu(y + (x if self.down is None else self.down(x)))

    def resnet18() -> Any:
        widths = (16, 32, 64, 128)
        layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
        cin = 16
        for i, w in enumerate(widths):
            layers += [Basic(cin, w, 1 if i == 0 else 2), Basic(w, w, 1)]
            cin = w
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 10)]
        return nn.Sequential(*layers)

    class InvertedSE(nn.Module):
        def __init__(self, cin: int, hidden: int, cout: int, stride: int) -> None:
            super().__init__()
            self.expand = nn.Sequential(nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.Hardswish())
            self.dw = nn.Sequential(
                nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                nn.BatchNorm2d(hidden),
                nn.Hardswish(),
            )
            self.se = nn.Sequential(
                nn.AdaptiveAvgPool2d(1),
                nn.Conv2d(hidden, hidden // 4, 1),
                nn.ReLU(),
                nn.Conv2d(hidden // 4, hidden, 1),
                nn.Hardsigmoid(),
            )
            self.project = nn.Sequential(nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.residual = stride == 1 and cin == cout

        def forward(self, x: Any) -> Any:
            y = self.dw(self.expand(x))
            y = self.project(y * self.se(y))
            return x + y if self.residual else y

    def mobilenetv3() -> Any:
        return nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1, bias=False),
            nn.BatchNorm2d(16),
            nn.Hardswish(),
            InvertedSE(16, 64, 24, 2),
            InvertedSE(24, 72, 24, 1),
            InvertedSE(24, 96, 40, 2),
            InvertedSE(40, 120, 40, 1),
            InvertedSE(40, 144, 48, 2),
            nn.Conv2d(48, 96, 1, bias=False),
            nn.BatchNorm2d(96),
            nn.Hardswish(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(96, 64),
            nn.Hardswish(),
            nn.Linear(64, 10),
        )

    class TwoInThreeOut(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1), nn.ReLU())
            self.mask = nn.Sequential(nn.Conv2d(32, 1, 1), nn.Sigmoid())
            self.meta = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
            self.logits = nn.Linear(64, 10)
            self.embedding = nn.Linear(64, 16)

        def forward(self, image: Any, meta: Any) -> Any:
            f = self.trunk(image)
            joint = torch.cat([f.mean(dim=(2, 3)), self.meta(meta)], dim=1)
            return self.logits(joint), self.embedding(joint), self.mask(f)

    def superres() -> Any:
        return nn.Sequential(
            nn.Conv2d(3, 32, 5, 1, 2),
            nn.Tanh(),
            nn.Conv2d(32, 16, 3, 1, 1),
            nn.Tanh(),
            nn.Conv2d(16, 3 * 4, 3, 1, 1),
            nn.PixelShuffle(2),
            nn.Sigmoid(),
        )

    return {"resnet18": resnet18, "mobilenetv3": mobilenetv3, "two_in_three_out": TwoInThreeOut, "superres": superres}


def _randomize_batchnorm(net: Any, seed: int) -> None:
    """Seeded running statistics, so batch norms are not identities (as trained ones are not)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for m in net.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.copy_(torch.randn(m.num_features, generator=gen) * 0.1)
            m.running_var.copy_(torch.rand(m.num_features, generator=gen) * 0.5 + 0.75)


def build_model(spec: CorpusModel, root: Path) -> Path:
    """Export ``spec`` as the model folder ``root/<name>/`` (``1/model.onnx``, ``config.yaml``).

    Weights: ``torch.manual_seed(26)`` then the modules' default initialisation; batch norm
    statistics seeded too. Returns the folder.

    Raises:
        ImportError: torch is not installed.
    """
    import torch

    torch.manual_seed(SEED)
    net = _nets()[spec.net]()
    _randomize_batchnorm(net, SEED)
    net.eval()
    folder = root / spec.name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    hw = (32, 32) if spec.net == "superres" else (SIZE, SIZE)
    batch_axis = {0: "batch"} if spec.dynamic_batch else {}
    spatial = {2: "height", 3: "width"} if spec.dynamic_hw else {}
    if spec.net == "two_in_three_out":
        args: tuple[Any, ...] = (torch.rand(1, 3, *hw), torch.rand(1, 8))
        names_in, names_out = ["image", "meta"], ["logits", "embedding", "mask"]
        axes = {n: dict(batch_axis) for n in names_in + names_out}
    else:
        args = (torch.rand(1, 3, *hw),)
        names_in, names_out = (["lr"], ["hr"]) if spec.net == "superres" else (["x"], ["logits"])
        axes = {names_in[0]: {**batch_axis, **spatial}, names_out[0]: dict(batch_axis)}
        if spec.net == "superres":
            axes[names_out[0]] = {**batch_axis, **spatial}
    with torch.no_grad(), warnings.catch_warnings():
        # the TorchScript exporter (dynamo=False) is the one that writes opsets 11 and 13 as asked
        warnings.simplefilter("ignore", DeprecationWarning)  # and the deprecations inside it
        torch.onnx.export(
            net,
            args,
            str(folder / "1" / "model.onnx"),
            opset_version=spec.opset,
            dynamo=False,
            input_names=names_in,
            output_names=names_out,
            dynamic_axes={k: v for k, v in axes.items() if v} or None,
        )
    config: dict[str, Any] = {"backend": "onnxruntime", "max_batch_size": 8 if spec.dynamic_batch else 0}
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return folder


def builtin_folder(name: str, root: Path, asset_path: Path) -> Path:
    """The built-in model ``name`` as a model folder ``root/<name>/`` (``1/model.onnx`` copied
    from ``asset_path``, ``config.yaml`` its built-in config)."""
    from frameserve.assets import builtin_model

    folder = root / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    shutil.copy(asset_path, folder / "1" / "model.onnx")
    (folder / "config.yaml").write_text(
        yaml.safe_dump(builtin_model(name).config_dict(), sort_keys=False), encoding="utf-8"
    )
    return folder


def calibration_images(folder: Path, *, count: int = 8, size: tuple[int, int] = (96, 128), seed: int = SEED) -> Path:
    """``count`` seeded PNG images ``size`` (h, w) in ``folder``: smooth gradients with
    rectangles, so resized crops are not noise. Returns the folder."""
    import cv2

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    h, w = size
    yy, xx = np.mgrid[0:h, 0:w]
    for i in range(count):
        base = np.stack([(xx * (i + 1) * 2) % 256, (yy * 3 + 40 * i) % 256, ((xx + yy) * (i + 2)) % 256], axis=-1)
        img = base.astype(np.uint8)
        for _ in range(3):
            x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
            color = tuple(int(c) for c in rng.integers(0, 256, 3))
            cv2.rectangle(img, (x0, y0), (x0 + int(rng.integers(8, 40)), y0 + int(rng.integers(8, 40))), color, -1)
        cv2.imwrite(str(folder / f"img{i:02d}.png"), img)
    return folder


def calibration_npz(path: Path, *, count: int = 8, seed: int = SEED) -> Path:
    """An ``.npz`` for ``two-in-three-out``: ``image`` float32 ``[count, 3, 64, 64]`` in
    ``[0, 1]`` and ``meta`` float32 ``[count, 8]`` standard normal, seeded. Returns ``path``."""
    rng = np.random.default_rng(seed)
    np.savez(
        path,
        image=rng.random((count, 3, SIZE, SIZE), dtype=np.float32),
        meta=rng.standard_normal((count, 8)).astype(np.float32),
    )
    return path
