"""Blob rasterisation against independent geometric definitions, and the texture bank's promises."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from experiments.data.shapes import ellipse_mask, random_blob_mask, star_polygon_mask
from experiments.data.textures import FIELD_BACKGROUND, LEGEND_FRAME, MAX_PERIOD, TEXTURE_BANK


def _inside_polygon_even_odd(px: float, py: float, vertices: np.ndarray) -> bool:
    """Ray casting (even-odd rule), written from the definition, for one point."""
    inside = False
    n = len(vertices)
    for j in range(n):
        (x1, y1), (x2, y2) = vertices[j], vertices[(j + 1) % n]
        if (y1 > py) != (y2 > py):
            x_cross = x1 + (py - y1) * (x2 - x1) / (y2 - y1)
            if px < x_cross:
                inside = not inside
    return inside


@pytest.mark.parametrize("seed", range(6))
def test_star_polygon_matches_ray_casting(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 8))
    gaps = rng.uniform(0.6, 1.4, size=n)
    gaps *= 2 * np.pi / gaps.sum()
    assert gaps.max() < np.pi
    angles = np.cumsum(gaps) - gaps[0] + rng.uniform(0, 0.5)
    radii = rng.uniform(4.0, 11.0, size=n)
    center = (15.0 + rng.uniform(0.1, 0.9), 16.0 + rng.uniform(0.1, 0.9))
    ys, xs = np.mgrid[0:32, 0:32]
    got = star_polygon_mask(ys, xs, center, angles, radii)
    vertices = np.stack(
        [center[1] + radii * np.cos(angles), center[0] + radii * np.sin(angles)], axis=1
    )
    expected = np.array(
        [[_inside_polygon_even_odd(x, y, vertices) for x in range(32)] for y in range(32)]
    )
    assert got.sum() > 20
    assert np.array_equal(got, expected)


def test_ellipse_matches_the_two_foci_definition():
    ys, xs = np.mgrid[0:40, 0:40]
    center, (a, b), angle = (19.3, 20.6), (12.0, 5.0), 0.7
    got = ellipse_mask(ys, xs, center, (a, b), angle)
    c = np.sqrt(a**2 - b**2)
    fx, fy = c * np.cos(angle), c * np.sin(angle)
    d1 = np.hypot(xs - (center[1] + fx), ys - (center[0] + fy))
    d2 = np.hypot(xs - (center[1] - fx), ys - (center[0] - fy))
    assert np.array_equal(got, d1 + d2 <= 2 * a + 1e-9)
    assert abs(got.sum() - np.pi * a * b) < 0.1 * np.pi * a * b


def test_random_blobs_stay_inside_their_disc():
    rng = np.random.default_rng(0)
    ys, xs = np.mgrid[0:40, 0:40]
    for _ in range(40):
        radius = rng.uniform(5, 15)
        center = (20 + rng.uniform(-1, 1), 20 + rng.uniform(-1, 1))
        blob = random_blob_mask(rng, ys, xs, center, radius)
        assert blob.sum() >= 0.2 * radius**2
        distance = np.hypot(ys - center[0], xs - center[1])
        assert distance[blob].max() <= radius + 1e-9


def test_textures_are_periodic_two_coloured_and_pairwise_distinct():
    canvas = 4 * MAX_PERIOD
    renders = [texture.render(canvas, canvas) for texture in TEXTURE_BANK]
    all_colours = []
    for texture, render in zip(TEXTURE_BANK, renders, strict=True):
        p = texture.period
        assert np.array_equal(render[p:], render[:-p]) and np.array_equal(
            render[:, p:], render[:, :-p]
        )
        colours = {tuple(c) for c in render.reshape(-1, 3).tolist()}
        assert colours == {
            tuple(np.float32(texture.foreground).tolist()),
            tuple(np.float32(texture.background).tolist()),
        }
        all_colours.extend(colours)
    reserved = {
        tuple(np.float32(FIELD_BACKGROUND).tolist()),
        tuple(np.float32(LEGEND_FRAME).tolist()),
    }
    assert len(set(all_colours)) == len(all_colours) and not reserved & set(all_colours)
    ys, xs = np.mgrid[0:canvas, 0:canvas]
    patterns = [texture.on_pixels(ys, xs) for texture in TEXTURE_BANK]
    for first, second in itertools.combinations(patterns, 2):
        assert not np.array_equal(first, second) and not np.array_equal(first, ~second)
