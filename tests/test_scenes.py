"""build/scenes.py: the scene generator behind the demo CLIP and captioner."""
from __future__ import annotations

import numpy as np
import pytest

from build.scenes import COLOUR_NAMES, COLOURS, SHAPES, Scene, Shape, random_scene, scenes


def test_caption_lists_every_shape_and_the_background():
    one = Scene("white", (Shape("circle", "red", (0.1, 0.1, 0.4, 0.4)),))
    assert one.caption() == "a red circle on a white background"
    two = Scene("white", (Shape("circle", "red", (0.1, 0.1, 0.4, 0.4)), Shape("square", "blue", (0.5, 0.5, 0.9, 0.9))))
    assert two.caption() == "a red circle and a blue square on a white background"
    three = Scene("black", two.shapes + (Shape("triangle", "green", (0.6, 0.0, 0.9, 0.3)),))
    assert three.caption() == "a red circle, a blue square and a green triangle on a black background"


def test_same_seed_same_scenes_and_pixels():
    a, b = scenes(7, 20), scenes(7, 20)
    assert a == b
    assert all(np.array_equal(np.asarray(x.render(48)), np.asarray(y.render(48))) for x, y in zip(a, b))
    assert scenes(8, 20) != a


def test_scenes_follow_the_rules():
    drawn = scenes(1, 300)
    assert {len(s.shapes) for s in drawn} == {1, 2, 3}
    assert {sh.kind for s in drawn for sh in s.shapes} == set(SHAPES)
    assert {sh.colour for s in drawn for sh in s.shapes} == set(COLOUR_NAMES)
    for scene in drawn:
        assert scene.background not in {sh.colour for sh in scene.shapes}
        boxes = [sh.box for sh in scene.shapes]
        assert all(0 <= v <= 1 for box in boxes for v in box)
        for i, p in enumerate(boxes):  # shapes never touch
            for q in boxes[i + 1:]:
                assert p[2] <= q[0] or q[2] <= p[0] or p[3] <= q[1] or q[3] <= p[1]
        assert [sh.box[0] for sh in scene.shapes] == sorted(sh.box[0] for sh in scene.shapes)


def test_rendered_shapes_have_their_colour_and_background_elsewhere():
    for scene in scenes(3, 50):
        size = 96
        pixels = np.asarray(scene.render(size))
        assert tuple(pixels[0, 0]) == COLOURS[scene.background] or any(
            sh.box[0] < 0.03 and sh.box[1] < 0.03 for sh in scene.shapes)
        for sh in scene.shapes:
            left, top, right, bottom = sh.box
            # a point inside every kind of shape: the box's centre column, 2/3 down (inside the triangle)
            x, y = int((left + right) / 2 * size), int((top + 2 * (bottom - top) / 3) * size)
            assert tuple(pixels[y, x]) == COLOURS[sh.colour], (scene, sh)


def test_jitter_stays_near_the_named_colour():
    rng = np.random.default_rng(0)
    scene = random_scene(np.random.default_rng(5), count=1)
    pixels = np.asarray(scene.render(32, jitter=20, rng=rng)).astype(int)
    assert np.abs(pixels[0, 0] - np.array(COLOURS[scene.background])).max() <= 20


def test_shape_count_is_bounded():
    with pytest.raises(ValueError):
        random_scene(np.random.default_rng(0), count=4)
