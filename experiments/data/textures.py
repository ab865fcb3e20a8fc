"""A fixed bank of periodic, locally distinguishable textures for the legend_seg dataset.

Every texture is a function of absolute pixel coordinates with a period of at most
``MAX_PERIOD`` pixels along both axes, drawn in its own pair of colours. Because it depends on
absolute coordinates, the same texture looks identical (up to a translation by whole periods)
wherever it is painted: in a legend patch or inside a blob. Which class a texture stands for is
decided per image by the legend, never by the bank.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PATTERNS = ("hstripes", "vstripes", "diag", "antidiag", "checker", "dots", "grid")
MAX_PERIOD = 6

FIELD_BACKGROUND = (0.08, 0.08, 0.08)
LEGEND_FRAME = (1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Texture:
    """A two-colour periodic pattern.

    Args:
        pattern: one of ``PATTERNS``.
        period: repeat length in pixels along both axes (2..MAX_PERIOD; even for ``checker``).
        foreground: RGB in [0, 1] of the pattern's "on" pixels.
        background: RGB in [0, 1] of its "off" pixels.
    """

    pattern: str
    period: int
    foreground: tuple[float, float, float]
    background: tuple[float, float, float]

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS:
            raise ValueError(
                f"Texture: pattern must be one of {', '.join(PATTERNS)}, got {self.pattern!r}"
            )
        if not 2 <= self.period <= MAX_PERIOD or (self.pattern == "checker" and self.period % 2):
            raise ValueError(
                f"Texture: period must be an integer in [2, {MAX_PERIOD}] (even for checker), "
                f"got {self.period!r}"
            )

    def on_pixels(self, ys: np.ndarray, xs: np.ndarray) -> np.ndarray:
        """Boolean "foreground" indicator at integer coordinates ``ys``, ``xs`` (same shape)."""
        p = self.period
        half = p // 2
        if self.pattern == "hstripes":
            return ys % p < half
        if self.pattern == "vstripes":
            return xs % p < half
        if self.pattern == "diag":
            return (xs + ys) % p < half
        if self.pattern == "antidiag":
            return (xs - ys) % p < half
        if self.pattern == "checker":
            return (xs // half + ys // half) % 2 == 0
        if self.pattern == "dots":
            return (xs % p < 2) & (ys % p < 2)
        return (xs % p == 0) | (ys % p == 0)

    def render(self, height: int, width: int) -> np.ndarray:
        """The texture over a whole ``(height, width)`` canvas: float32 ``(height, width, 3)``."""
        ys, xs = np.mgrid[0:height, 0:width]
        on = self.on_pixels(ys, xs)[..., None]
        fg = np.asarray(self.foreground, dtype=np.float32)
        bg = np.asarray(self.background, dtype=np.float32)
        return np.where(on, fg, bg).astype(np.float32)


TEXTURE_BANK: tuple[Texture, ...] = (
    Texture("hstripes", 4, (0.90, 0.20, 0.20), (1.00, 0.95, 0.60)),
    Texture("vstripes", 6, (0.20, 0.30, 0.90), (0.70, 0.95, 1.00)),
    Texture("diag", 6, (0.10, 0.70, 0.30), (0.35, 0.10, 0.45)),
    Texture("antidiag", 4, (1.00, 0.60, 0.10), (0.10, 0.15, 0.40)),
    Texture("checker", 4, (0.90, 0.30, 0.80), (0.05, 0.35, 0.20)),
    Texture("dots", 4, (0.95, 0.90, 0.20), (0.45, 0.25, 0.10)),
    Texture("grid", 5, (0.10, 0.80, 0.85), (0.50, 0.05, 0.15)),
    Texture("checker", 6, (0.60, 0.95, 0.30), (0.30, 0.35, 0.50)),
)


def render_bank(height: int, width: int, bank: tuple[Texture, ...] = TEXTURE_BANK) -> np.ndarray:
    """Every texture of ``bank`` over a ``(height, width)`` canvas: float32 ``(K, H, W, 3)``."""
    return np.stack([texture.render(height, width) for texture in bank])
