"""Image scaling and per-file assignment: pure functions, no storage."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
from PIL import Image

from scalingrun_trainer.preprocess.images import BadImage, fitted_size, scale_image
from scalingrun_trainer.preprocess.source import assign, rows_per_group


def encode(image: Image.Image, fmt: str = "JPEG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt)
    return buffer.getvalue()


def test_fitted_size_matches_thumbnail_rounding():
    rng = random.Random(0)
    for _ in range(2000):
        w, h = rng.randint(300, 4000), rng.randint(300, 4000)
        image = Image.new("L", (w, h))
        image.thumbnail((299, 299))
        assert fitted_size(w, h, 299) == image.size, (w, h)


DARK = {"RGB": (200, 10, 10), "L": 0, "CMYK": (0, 0, 0, 255), "RGBA": (0, 0, 0, 255), "P": 0}


@pytest.mark.parametrize("mode", DARK)
def test_every_decodable_mode_becomes_rgb_square(mode):
    fmt = "PNG" if mode in ("RGBA", "P") else "JPEG"
    image = Image.new(mode, (640, 320), DARK[mode])
    out = np.frombuffer(scale_image(encode(image, fmt), 96), np.uint8).reshape(96, 96, 3)
    assert out.shape == (96, 96, 3)
    # 640x320 -> 96x48 centred: white bands of 24 rows above and below
    assert (out[:23] == 255).all() and (out[-23:] == 255).all()
    assert not (out[30:66] == 255).all()


def test_small_images_are_enlarged_to_fill_the_square():
    out = np.frombuffer(scale_image(encode(Image.new("L", (28, 28), 0)), 96), np.uint8)
    assert out.max() < 60  # no white padding left: the 28 px image fills 96 x 96


@pytest.mark.parametrize("data", [b"", b"hello, not an image", encode(Image.new("RGB", (400, 400)))[:300]],
                         ids=["empty", "text", "truncated-jpeg"])
def test_undecodable_bytes_raise_bad_image(data):
    with pytest.raises(BadImage):
        scale_image(data, 64)


def test_assignment_is_deterministic_and_follows_the_fractions():
    paths = [f"class{i % 7}/img{i}.jpg" for i in range(20000)]
    first = [assign(p, 42, 0.5, 0.2, 4) for p in paths]
    assert first == [assign(p, 42, 0.5, 0.2, 4) for p in paths]
    kept = [a for a in first if a]
    assert 0.48 < len(kept) / len(paths) < 0.52
    assert 0.18 < sum(a.split == "validation" for a in kept) / len(kept) < 0.22
    assert {a.shard for a in kept} == {0, 1, 2, 3}
    # the split does not depend on the shard count; another seed gives another split
    assert [a.split for a in kept] == [assign(p, 42, 0.5, 0.2, 9).split for p, a in zip(paths, first) if a]
    assert [a and a.split for a in first] != [(b := assign(p, 7, 0.5, 0.2, 4)) and b.split for p in paths]


def test_rows_per_group_gives_two_groups_per_reader():
    assert rows_per_group(1000, shard_count=1, min_groups_per_split=16) == 62  # 1000 // 16
    assert rows_per_group(1000, shard_count=4, min_groups_per_split=16) == 250
    assert rows_per_group(100000, shard_count=1, min_groups_per_split=2) == 256  # capped
    assert rows_per_group(3, shard_count=1, min_groups_per_split=16) == 1


def test_greyscale_resized_before_conversion_gives_the_rgb_paths_bytes():
    rng = np.random.default_rng(0)
    grey = Image.fromarray(rng.integers(0, 256, (500, 380), dtype=np.uint8), "L")
    # PNG: lossless, so both files hold the same pixels and only the mode differs
    assert scale_image(encode(grey, "PNG"), 96) == scale_image(encode(grey.convert("RGB"), "PNG"), 96)


def seeds_scale_image(data: bytes, side: int) -> bytes:
    """The reference articles' code: convert, thumbnail with Lanczos, paste on white."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    image.thumbnail((side, side), Image.LANCZOS)
    canvas = Image.new("RGB", (side, side), (255, 255, 255))
    canvas.paste(image, ((side - image.size[0]) // 2, (side - image.size[1]) // 2))
    return canvas.tobytes()


def test_output_stays_within_32_db_of_the_seeds_on_real_photos():
    from scalingrun_operator.local.sample_data import photos

    for name, photo in photos():
        for long_side in (640, 1600):
            scale = long_side / max(photo.size)
            data = encode(photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.BICUBIC))
            ours = np.frombuffer(scale_image(data, 299), np.uint8).astype(float)
            theirs = np.frombuffer(seeds_scale_image(data, 299), np.uint8).astype(float)
            psnr = 10 * np.log10(255**2 / max(np.mean((ours - theirs) ** 2), 1e-12))
            assert psnr >= 32, (name, long_side, psnr)
