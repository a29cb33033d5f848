"""Reading dataset images as 8-bit RGB, whatever their file stores; errors name the file.

Every mode PIL opens becomes ``[H, W, 3]`` uint8 RGB: grayscale is repeated on the three
channels, CMYK and palette images go through PIL's conversion, an alpha channel is dropped (as
PIL's ``convert("RGB")`` and torchvision's ``ImageReadMode.RGB`` do), and 16-bit images keep
their 8 high bits (``value >> 8``, as torchvision's ``to_dtype``), where ``convert("RGB")``
would clip every value above 255 to white. The EXIF orientation is applied
(``ImageOps.exif_transpose``): annotations are taken to describe the image as it is displayed,
as annotation tools show it; the datasets check each image's size against its annotation, so a
file annotated on its stored pixels fails with a message that names the orientation instead of
training on turned labels.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, JpegImagePlugin

from vision_tx.data.invalid import InvalidDataError

EXIF_ORIENTATION = 0x0112
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


class ImageReadError(InvalidDataError):
    """An image file that cannot be read: the message names the file and the problem."""


def exif_orientation(image: Image.Image) -> int:
    """The EXIF orientation tag of ``image`` (1 = as stored; 5-8 swap height and width)."""
    return int(image.getexif().get(EXIF_ORIENTATION, 1))


def orientation_note(path: str | os.PathLike) -> str:
    """For a size-mismatch message: a note when the EXIF orientation of the file at ``path`` turns its stored pixels."""
    try:
        with Image.open(path) as image:
            orientation, stored = exif_orientation(image), image.size
    except (OSError, SyntaxError, ValueError):
        return ""
    if orientation == 1:
        return ""
    return (
        f" (the file is stored {stored[1]}x{stored[0]} (h x w) with EXIF orientation {orientation}, which turns it "
        "for display: were the annotations made on the stored pixels? Then rotate the file to match them)"
    )


def _to_rgb(image: Image.Image, path: Path) -> np.ndarray:
    if image.mode in SIXTEEN_BIT_MODES:
        values = np.asarray(image).astype(np.int64)
        if values.size and (values.min() < 0 or values.max() > 65535):
            raise ImageReadError(
                f"{path}: a {image.mode} image with values in [{values.min()}, {values.max()}], "
                "outside the 16-bit range; convert it to 8-bit"
            )
        return np.repeat((values >> 8).astype(np.uint8)[..., None], 3, axis=2)
    if image.mode == "F":
        raise ImageReadError(
            f"{path}: a floating-point image (mode F) has no standard 8-bit scale; convert it to 8-bit"
        )
    return np.array(image if image.mode == "RGB" else image.convert("RGB"))  # convert copies even an RGB image


def read_rgb_image(path: str | os.PathLike) -> np.ndarray:
    """The image at ``path`` as ``[H, W, 3]`` uint8 RGB with its EXIF orientation applied.

    Raises ``ImageReadError`` naming the file for a missing, unrecognised, corrupt or truncated file.
    """
    return decode_rgb_image(path)[0]


def reduced_jpeg_request(width: int, height: int, min_shorter_side: int) -> tuple[int, int]:
    """The size ``(w, h)`` to ask PIL's ``draft`` for so that a JPEG ``width`` wide and ``height`` high is decoded
    reduced with its shorter side still at least ``min_shorter_side`` (``draft`` reduces by the largest of 2, 4 and 8
    that keeps both sides at least the request's, or not at all)."""
    shorter = min(width, height)
    return math.ceil(width * min_shorter_side / shorter), math.ceil(height * min_shorter_side / shorter)


def decode_rgb_image(
    path: str | os.PathLike, min_shorter_side: int | None = None
) -> tuple[np.ndarray, tuple[int, int]]:
    """The image at ``path`` as :func:`read_rgb_image` reads it, and its full size ``(h, w)`` as displayed.

    With ``min_shorter_side``, a JPEG is decoded reduced, by 2, 4 or 8 on each side (libjpeg's DCT scaling, through
    PIL's ``draft``), as far as its shorter side stays at least ``min_shorter_side`` pixels: the array is then smaller
    than the full size (each side the full one divided by the factor, rounded up). A 12-megapixel photograph read for
    a model that sees it at 192 pixels decodes about 12 times faster. Other formats are read whole.
    """
    path = Path(path)
    if not path.is_file():
        raise ImageReadError(f"{path}: image file not found")
    try:
        with Image.open(path) as stored:
            orientation = exif_orientation(stored)
            width, height = stored.size
            full_size = (width, height) if orientation in (5, 6, 7, 8) else (height, width)
            if min_shorter_side is not None and isinstance(stored, JpegImagePlugin.JpegImageFile):  # MPO too
                stored.draft(None, reduced_jpeg_request(width, height, min_shorter_side))
            stored.load()
            # exif_transpose copies the pixels even where the orientation turns nothing
            image = ImageOps.exif_transpose(stored) if orientation != 1 else stored
            return _to_rgb(image, path), full_size  # before the file closes: closing may free the pixels
    except ImageReadError:
        raise
    except Image.UnidentifiedImageError as err:
        raise ImageReadError(f"{path}: not an image file, or a format PIL cannot read") from err
    except Image.DecompressionBombError as err:
        raise ImageReadError(f"{path}: too many pixels to be a dataset image ({err})") from err
    except (OSError, SyntaxError, ValueError) as err:
        raise ImageReadError(f"{path}: corrupt or truncated image ({err})") from err
