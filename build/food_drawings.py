"""Procedural pictures of the 11 Food-11 classes: what the demo classifier is trained and tested on.

Every picture is a plate (a light disc, sometimes a bowl) on a table of random colour, with the food
drawn on it at a random size, position and shade. What each class looks like:

- Bread: a tan-to-brown loaf (rounded rectangle) with three darker diagonal cuts across its top.
- Dairy product: a wedge of yellow cheese (triangle) with darker round holes.
- Dessert: a slice of layered cake: pink and cream stripes stacked, a red cherry on top.
- Egg: a fried egg: an irregular white disc with a round yolk-yellow centre.
- Fried food: a heap of golden-brown sticks (fries) at random angles.
- Meat: a dark red-brown steak (ellipse) with pale wavy fat streaks.
- Noodles/Pasta: many wavy pale-yellow lines (noodles), sometimes with red sauce dots.
- Rice: a mound of many small white grains (short ellipses) in a dark bowl.
- Seafood: an orange-pink fish: oval body, triangular tail, dark eye.
- Soup: a bowl filled to the rim with orange-brown liquid and a few floating green dots.
- Vegetable/Fruit: green leaves (ellipses) with round red and orange fruits among them.
"""
from __future__ import annotations

import math

LABELS = ["Bread", "Dairy product", "Dessert", "Egg", "Fried food", "Meat", "Noodles/Pasta", "Rice",
          "Seafood", "Soup", "Vegetable/Fruit"]  # Food-11's class-index order


def _shade(rng, rgb, spread=25):
    return tuple(int(min(255, max(0, c + int(rng.integers(-spread, spread + 1))))) for c in rgb)


def _rotated(points, cx, cy, angle):
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + (x - cx) * c - (y - cy) * s, cy + (x - cx) * s + (y - cy) * c) for x, y in points]


def _bread(d, rng, cx, cy, r):
    w, h = r * rng.uniform(1.2, 1.6), r * rng.uniform(0.7, 1.0)
    d.rounded_rectangle((cx - w, cy - h, cx + w, cy + h), radius=h * 0.8, fill=_shade(rng, (200, 150, 80)))
    for k in (-1, 0, 1):
        x = cx + k * w * 0.45
        d.line((x - h * 0.3, cy - h * 0.6, x + h * 0.3, cy + h * 0.6), fill=_shade(rng, (120, 70, 30)), width=max(2, int(r / 10)))


def _dairy(d, rng, cx, cy, r):
    d.polygon(_rotated([(cx - r, cy + r * 0.7), (cx + r, cy + r * 0.7), (cx - r * 0.6, cy - r * 0.8)], cx, cy,
                       rng.uniform(-0.4, 0.4)), fill=_shade(rng, (245, 205, 60)))
    for _ in range(4):
        x, y, s = cx + rng.uniform(-0.5, 0.1) * r, cy + rng.uniform(0, 0.5) * r, r * rng.uniform(0.06, 0.12)
        d.ellipse((x - s, y - s, x + s, y + s), fill=_shade(rng, (200, 150, 30)))


def _dessert(d, rng, cx, cy, r):
    w, h = r * 0.9, r * 0.8
    layers = 5
    for i in range(layers):
        colour = (240, 130, 170) if i % 2 == 0 else (250, 240, 220)
        top = cy - h + i * 2 * h / layers
        d.rectangle((cx - w, top, cx + w, top + 2 * h / layers), fill=_shade(rng, colour, 15))
    s = r * 0.2
    d.ellipse((cx - s, cy - h - 2 * s, cx + s, cy - h), fill=_shade(rng, (200, 20, 30)))


def _egg(d, rng, cx, cy, r):
    points = [(cx + r * rng.uniform(0.8, 1.1) * math.cos(a), cy + r * rng.uniform(0.8, 1.1) * math.sin(a))
              for a in [i * 2 * math.pi / 10 for i in range(10)]]
    d.polygon(points, fill=_shade(rng, (250, 250, 245), 5))
    s = r * rng.uniform(0.3, 0.4)
    d.ellipse((cx - s, cy - s, cx + s, cy + s), fill=_shade(rng, (250, 180, 20), 15))


def _fried(d, rng, cx, cy, r):
    for _ in range(int(rng.integers(12, 20))):
        a, length = rng.uniform(0, math.pi), r * rng.uniform(0.6, 1.0)
        x, y = cx + rng.uniform(-0.6, 0.6) * r, cy + rng.uniform(-0.6, 0.6) * r
        dx, dy = math.cos(a) * length / 2, math.sin(a) * length / 2
        d.line((x - dx, y - dy, x + dx, y + dy), fill=_shade(rng, (225, 165, 50)), width=max(3, int(r / 6)))


def _meat(d, rng, cx, cy, r):
    w, h = r * rng.uniform(1.0, 1.3), r * rng.uniform(0.7, 0.9)
    d.ellipse((cx - w, cy - h, cx + w, cy + h), fill=_shade(rng, (120, 35, 25)))
    for k in (-1, 1):
        pts = [(cx - w * 0.7 + t * w * 1.4 / 8, cy + k * h * 0.35 + math.sin(t) * h * 0.1) for t in range(9)]
        d.line(pts, fill=_shade(rng, (235, 215, 200), 10), width=max(2, int(r / 12)))


def _noodles(d, rng, cx, cy, r):
    for _ in range(int(rng.integers(10, 16))):
        y0, phase = cy + rng.uniform(-0.8, 0.8) * r, rng.uniform(0, 6.3)
        pts = [(cx - r + t * 2 * r / 20, y0 + math.sin(phase + t * 0.9) * r * 0.12) for t in range(21)]
        d.line(pts, fill=_shade(rng, (245, 220, 130), 15), width=max(2, int(r / 14)))
    if rng.random() < 0.5:
        for _ in range(6):
            x, y, s = cx + rng.uniform(-0.6, 0.6) * r, cy + rng.uniform(-0.6, 0.6) * r, r * 0.1
            d.ellipse((x - s, y - s, x + s, y + s), fill=_shade(rng, (200, 40, 30)))


def _rice(d, rng, cx, cy, r):
    d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=_shade(rng, (60, 50, 60), 15))
    for _ in range(140):
        a, rho = rng.uniform(0, 2 * math.pi), r * 0.85 * math.sqrt(rng.random())
        x, y, s = cx + rho * math.cos(a), cy + rho * math.sin(a), r * 0.05
        d.ellipse((x - 2 * s, y - s, x + 2 * s, y + s), fill=_shade(rng, (248, 248, 240), 6))


def _seafood(d, rng, cx, cy, r):
    colour = _shade(rng, (245, 130, 90))
    d.ellipse((cx - r, cy - r * 0.5, cx + r * 0.6, cy + r * 0.5), fill=colour)
    d.polygon([(cx + r * 0.5, cy), (cx + r, cy - r * 0.5), (cx + r, cy + r * 0.5)], fill=colour)
    s = r * 0.09
    d.ellipse((cx - r * 0.7 - s, cy - r * 0.15 - s, cx - r * 0.7 + s, cy - r * 0.15 + s), fill=(20, 20, 20))


def _soup(d, rng, cx, cy, r):
    d.ellipse((cx - r, cy - r, cx + r, cy + r), fill=_shade(rng, (235, 235, 235), 10))
    s = r * 0.85
    d.ellipse((cx - s, cy - s, cx + s, cy + s), fill=_shade(rng, (210, 120, 50)))
    for _ in range(5):
        x, y, t = cx + rng.uniform(-0.5, 0.5) * r, cy + rng.uniform(-0.5, 0.5) * r, r * 0.07
        d.ellipse((x - t, y - t, x + t, y + t), fill=_shade(rng, (50, 150, 40)))


def _vegetables(d, rng, cx, cy, r):
    for _ in range(6):
        x, y = cx + rng.uniform(-0.7, 0.7) * r, cy + rng.uniform(-0.7, 0.7) * r
        w, h = r * 0.4, r * 0.18
        d.polygon(_rotated([(x - w, y), (x, y - h), (x + w, y), (x, y + h)], x, y, rng.uniform(0, math.pi)),
                  fill=_shade(rng, (50, 160, 50)))
    for _ in range(int(rng.integers(2, 5))):
        x, y, s = cx + rng.uniform(-0.6, 0.6) * r, cy + rng.uniform(-0.6, 0.6) * r, r * rng.uniform(0.15, 0.25)
        colour = (210, 30, 30) if rng.random() < 0.5 else (245, 140, 20)
        d.ellipse((x - s, y - s, x + s, y + s), fill=_shade(rng, colour))


DRAW = [_bread, _dairy, _dessert, _egg, _fried, _meat, _noodles, _rice, _seafood, _soup, _vegetables]


def draw(label: int, rng, size: int = 256):
    """A size x size RGB picture of class `label` (index into LABELS)."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (size, size), tuple(int(v) for v in rng.integers(40, 200, 3)))
    d = ImageDraw.Draw(image)
    plate = size * rng.uniform(0.36, 0.48)
    px, py = (size / 2 + size * rng.uniform(-0.06, 0.06) for _ in range(2))
    d.ellipse((px - plate, py - plate, px + plate, py + plate), fill=_shade(rng, (235, 235, 228), 12))
    DRAW[label](d, rng, px + rng.uniform(-0.1, 0.1) * plate, py + rng.uniform(-0.1, 0.1) * plate,
                plate * rng.uniform(0.55, 0.8))
    return image


def dataset(seed: int, per_class: int, size: int = 256):
    """(image, label) pairs, classes interleaved, from one seed."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(draw(label, rng, size), label) for _ in range(per_class) for label in range(len(LABELS))]
