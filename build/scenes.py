"""Scenes: the one image generator behind the demo vision models (CLIP and the BLIP captioner).

A scene is 1 to 3 shapes (circle, square, triangle) in six colours on a plain background of a colour
that none of its shapes has, each shape at its own size and position without touching another. Each
scene comes with its caption, e.g. "a red circle and a blue square on a white background".
Everything is drawn from a numpy Generator, so a seed gives the same scenes on every machine.
"""
from __future__ import annotations

from dataclasses import dataclass

SHAPES = ("circle", "square", "triangle")
COLOURS = {"red": (220, 30, 30), "green": (30, 170, 50), "blue": (40, 70, 220), "yellow": (240, 220, 40),
           "white": (250, 250, 250), "black": (15, 15, 15)}
COLOUR_NAMES = tuple(COLOURS)
MAX_SHAPES = 3


@dataclass(frozen=True)
class Shape:
    kind: str  # one of SHAPES
    colour: str  # one of COLOUR_NAMES
    box: tuple[float, float, float, float]  # left, top, right, bottom as fractions of the image side

    def phrase(self) -> str:
        return f"a {self.colour} {self.kind}"


@dataclass(frozen=True)
class Scene:
    background: str
    shapes: tuple[Shape, ...]

    def caption(self) -> str:
        phrases = [s.phrase() for s in self.shapes]
        listed = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
        return f"{listed} on a {self.background} background"

    def render(self, size: int = 64, jitter: int = 0, rng=None):
        """The scene as an RGB PIL image of size x size pixels; jitter > 0 varies each colour by up to
        +-jitter per channel (drawn from rng), as lighting would."""
        from PIL import Image, ImageDraw

        def rgb(name: str) -> tuple[int, int, int]:
            if not jitter:
                return COLOURS[name]
            return tuple(int(min(255, max(0, c + int(rng.integers(-jitter, jitter + 1))))) for c in COLOURS[name])

        image = Image.new("RGB", (size, size), rgb(self.background))
        draw = ImageDraw.Draw(image)
        for shape in self.shapes:
            left, top, right, bottom = (v * size for v in shape.box)
            fill = rgb(shape.colour)
            if shape.kind == "circle":
                draw.ellipse((left, top, right, bottom), fill=fill)
            elif shape.kind == "square":
                draw.rectangle((left, top, right, bottom), fill=fill)
            else:  # upright triangle inscribed in its box
                draw.polygon([((left + right) / 2, top), (right, bottom), (left, bottom)], fill=fill)
        return image


def _overlaps(a, b, gap: float = 0.02) -> bool:
    return not (a[2] + gap <= b[0] or b[2] + gap <= a[0] or a[3] + gap <= b[1] or b[3] + gap <= a[1])


def random_scene(rng, count: int | None = None, kinds=SHAPES, colours=COLOUR_NAMES,
                 min_side: float = 0.2, max_side: float = 0.5) -> Scene:
    """A random scene with `count` shapes (1..3 when None); shape sides are fractions of the image."""
    count = int(rng.integers(1, MAX_SHAPES + 1)) if count is None else count
    if not 1 <= count <= MAX_SHAPES:
        raise ValueError(f"a scene holds 1 to {MAX_SHAPES} shapes, not {count}")
    while True:  # shapes that do not fit without touching are drawn again (rare at these sizes)
        chosen = [(str(rng.choice(kinds)), str(rng.choice(colours))) for _ in range(count)]
        used = {colour for _, colour in chosen}
        background = str(rng.choice([c for c in COLOUR_NAMES if c not in used]))
        boxes: list[tuple[float, float, float, float]] = []
        for _ in range(count):
            for _attempt in range(50):
                side = float(rng.uniform(min_side, max_side if count == 1 else min(max_side, 0.4)))
                left, top = (float(v) for v in rng.uniform(0.02, 0.98 - side, 2))
                box = (round(left, 4), round(top, 4), round(left + side, 4), round(top + side, 4))
                if not any(_overlaps(box, other) for other in boxes):
                    boxes.append(box)
                    break
        if len(boxes) == count:
            # listed left to right, so a caption reads as the picture does
            shapes = sorted((Shape(kind, colour, box) for (kind, colour), box in zip(chosen, boxes)),
                            key=lambda s: s.box[0])
            return Scene(background, tuple(shapes))


def scenes(seed: int, n: int, **kwargs) -> list[Scene]:
    import numpy as np

    rng = np.random.default_rng(seed)
    return [random_scene(rng, **kwargs) for _ in range(n)]
