"""Random blob shapes (rotated ellipses and star-shaped polygons) rasterised with numpy.

Each shape lies inside the disc of radius ``radius`` around its centre, so a caller can place it
by choosing the centre at least ``radius`` pixels away from the canvas border.
"""

from __future__ import annotations

import numpy as np


def ellipse_mask(
    ys: np.ndarray,
    xs: np.ndarray,
    center: tuple[float, float],
    axes: tuple[float, float],
    angle: float,
) -> np.ndarray:
    """Pixels inside a rotated ellipse.

    Args:
        ys, xs: integer pixel coordinates, any equal shapes (e.g. from ``np.mgrid``).
        center: ``(cy, cx)``.
        axes: semi-axes ``(a, b)`` along the rotated x and y directions.
        angle: rotation in radians.

    Returns:
        A boolean array shaped like ``ys``.
    """
    dy, dx = ys - center[0], xs - center[1]
    cos, sin = np.cos(angle), np.sin(angle)
    u = cos * dx + sin * dy
    v = -sin * dx + cos * dy
    return (u / axes[0]) ** 2 + (v / axes[1]) ** 2 <= 1.0


def star_polygon_mask(
    ys: np.ndarray,
    xs: np.ndarray,
    center: tuple[float, float],
    angles: np.ndarray,
    radii: np.ndarray,
) -> np.ndarray:
    """Pixels inside a polygon that is star-shaped about ``center``.

    Vertex ``j`` sits at polar coordinates ``(radii[j], angles[j])`` around the centre. The
    angles must increase strictly within ``[0, 2*pi)`` with consecutive gaps (cyclically) below
    pi, so that the centre sees every edge from its inner side.

    Args:
        ys, xs: integer pixel coordinates, any equal shapes.
        center: ``(cy, cx)``.
        angles: ``(n,)`` vertex angles, n >= 3.
        radii: ``(n,)`` vertex distances from the centre.

    Returns:
        A boolean array shaped like ``ys``.
    """
    dy, dx = ys - center[0], xs - center[1]
    vx, vy = radii * np.cos(angles), radii * np.sin(angles)
    phi = np.mod(np.arctan2(dy, dx), 2 * np.pi)
    start = (np.searchsorted(angles, phi, side="right") - 1) % len(angles)
    end = (start + 1) % len(angles)
    edge_x, edge_y = vx[end] - vx[start], vy[end] - vy[start]
    cross = edge_x * (dy - vy[start]) - edge_y * (dx - vx[start])
    return cross >= 0


def random_blob_mask(
    rng: np.random.Generator,
    ys: np.ndarray,
    xs: np.ndarray,
    center: tuple[float, float],
    radius: float,
) -> np.ndarray:
    """A random ellipse or polygon (3 to 7 vertices) inside the disc ``(center, radius)``.

    Polygon vertices are evenly spaced in angle with a jitter of at most 20% of the spacing, so
    consecutive gaps stay below 1.4 * 2 * pi / 3 < pi, as ``star_polygon_mask`` requires.

    Returns:
        A boolean array shaped like ``ys``.
    """
    if rng.random() < 0.5:
        minor = radius * rng.uniform(0.5, 1.0)
        return ellipse_mask(ys, xs, center, (radius, minor), rng.uniform(0.0, np.pi))
    n = int(rng.integers(3, 8))
    spacing = 2 * np.pi / n
    jitter = rng.uniform(-0.2, 0.2, size=n) * spacing
    angles = np.mod(rng.uniform(0.0, 2 * np.pi) + spacing * np.arange(n) + jitter, 2 * np.pi)
    order = np.argsort(angles)
    radii = radius * rng.uniform(0.6, 1.0, size=n)
    return star_polygon_mask(ys, xs, center, angles[order], radii[order])
