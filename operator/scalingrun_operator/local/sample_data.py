"""Real sample images for the quick start, tests and benchmarks: Debian's Fashion-MNIST and scikit-image's photos.
Nothing is downloaded. Here, not in the trainer package, so that the local runner and the tests use it without the
operator importing the trainer; numpy and Pillow (a local machine's, never the operator image's) load when used."""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"  # Debian package dataset-fashion-mnist
FASHION_MNIST_CLASSES = [
    "t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle-boot",
]
PHOTO_NAMES = ["astronaut", "coffee", "chelsea", "rocket", "cat", "hubble_deep_field", "immunohistochemistry",
               "camera", "moon", "coins", "logo", "colorwheel", "page", "text"]


def fashion_mnist(split: str = "t10k") -> tuple[np.ndarray, np.ndarray]:
    """(images N x 28 x 28 uint8, labels N) from the Debian package dataset-fashion-mnist."""
    import numpy as np

    with gzip.open(Path(FASHION_MNIST_DIR) / f"{split}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(Path(FASHION_MNIST_DIR) / f"{split}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    return images, labels


def fashion_mnist_jpegs(count_per_class: int, split: str = "t10k", size: int | None = None,
                        quality: int = 90) -> Iterator[tuple[str, bytes]]:
    """(class-folder/file.jpg, JPEG bytes); `size` upscales (the 28 px originals are tiny)."""
    from PIL import Image

    images, labels = fashion_mnist(split)
    taken = {c: 0 for c in range(len(FASHION_MNIST_CLASSES))}
    for index, (pixels, label) in enumerate(zip(images, labels)):
        if taken[int(label)] >= count_per_class:
            continue
        taken[int(label)] += 1
        image = Image.fromarray(255 - pixels)  # dark garment on white, like a product photo
        if size:
            image = image.resize((size, size), Image.BICUBIC)
        buffer = io.BytesIO()
        image.save(buffer, "JPEG", quality=quality)
        yield f"{FASHION_MNIST_CLASSES[int(label)]}/{split}-{index:05d}.jpg", buffer.getvalue()
        if all(v >= count_per_class for v in taken.values()):
            return


def photos() -> Iterator[tuple[str, Image.Image]]:
    """scikit-image's sample photos as PIL images (RGB or L)."""
    import numpy as np
    from PIL import Image
    from skimage import data

    for name in PHOTO_NAMES:
        pixels = getattr(data, name)()
        if pixels.dtype != np.uint8:
            pixels = (pixels * 255).clip(0, 255).astype(np.uint8)
        if pixels.ndim == 3 and pixels.shape[2] == 4:
            pixels = pixels[..., :3]
        yield name, Image.fromarray(pixels)
