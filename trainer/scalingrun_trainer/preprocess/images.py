"""Image scaling: aspect kept, fitted into a square, centred on white, as raw RGB bytes.

Faster than the seeds' `convert -> thumbnail -> paste` because JPEGs are decoded at a reduced scale
(`draft`, DCT-domain downscaling), greyscale images are resized on their one channel before becoming
RGB, and the resampling filter is bicubic rather than Lanczos. The target size is computed from the
original size, the way `thumbnail` would, so that drafting never shifts a pixel. Unlike `thumbnail`,
images smaller than the square are enlarged to fill it.
"""

from __future__ import annotations

import io
import math
import warnings

from PIL import Image, UnidentifiedImageError

WHITE = (255, 255, 255)
# JPEG drafting decodes at 1/2, 1/4 or 1/8 scale, never below the requested size, so LANCZOS then
# resamples from between 1x and 2x the target. Measured (bench/preprocess.py): margin 1 is 2.4x the
# seeds' speed at >= 34 dB PSNR against their output; margin 2 only 1.25x.
DRAFT_MARGIN = 1
# After drafting, resampling costs about as much as decoding, and LANCZOS' support is twice BICUBIC's.
# Measured (bench/preprocess.py, CPU time): BICUBIC 1.2x faster than LANCZOS, PSNR against the seeds'
# LANCZOS output >= 34 dB; HAMMING faster still but 32.8 dB, too near the 32 dB floor.
RESAMPLE = Image.BICUBIC
# Modes whose RGB form repeats one channel: resizing before converting gives the same bytes, a third of the work.
CONVERT_AFTER_RESIZE = {"L"}


class BadImage(ValueError):
    """The bytes are not a decodable image."""


def fitted_size(width: int, height: int, side: int) -> tuple[int, int]:
    """Largest size with the image's aspect ratio that fits in side x side (as Image.thumbnail rounds)."""
    aspect = width / height
    if aspect >= 1:
        w = side
        h = min(
            (math.floor(side / aspect), math.ceil(side / aspect)),
            key=lambda n: abs(aspect - side / n) if n else math.inf,
        )
    else:
        h = side
        w = min((math.floor(side * aspect), math.ceil(side * aspect)), key=lambda n: abs(aspect - n / side))
    return max(w, 1), max(h, 1)


def scale_image(data: bytes, side: int) -> bytes:
    """side x side x 3 uint8 RGB, row-major. Raises BadImage for anything that does not decode."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            target = fitted_size(image.width, image.height, side)
            image.draft("RGB", (target[0] * DRAFT_MARGIN, target[1] * DRAFT_MARGIN))
            image.load()
    except UnidentifiedImageError:
        raise BadImage("not an image in a format Pillow can decode") from None
    except Exception as exc:  # PIL raises many types for corrupt data; all mean "skip this file"
        raise BadImage(f"{type(exc).__name__}: {exc}") from None
    if image.mode != "RGB" and image.mode not in CONVERT_AFTER_RESIZE:
        # Alpha is dropped the way the seeds' convert('RGB') drops it; CMYK and P convert.
        image = image.convert("RGB")
    if image.size != target:
        image = image.resize(target, RESAMPLE, reducing_gap=None)
    if image.mode != "RGB":
        image = image.convert("RGB")
    if target == (side, side):
        return image.tobytes()
    canvas = Image.new("RGB", (side, side), WHITE)
    canvas.paste(image, ((side - target[0]) // 2, (side - target[1]) // 2))
    return canvas.tobytes()
