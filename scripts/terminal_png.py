"""Render a terminal capture with colours (``tmux capture-pane -e -p``) to a PNG, for the docs' screenshots.

    tmux capture-pane -e -p -t top > top.ansi
    python scripts/terminal_png.py top.ansi docs/img/top.png

Reads SGR sequences (bold, dim, reverse, the 16 colours, 256 colours, true colour) and ignores every other escape;
draws with DejaVu Sans Mono (Debian's fonts-dejavu-core) through Pillow.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from PIL import Image, ImageDraw, ImageFont

FONT_DIR = Path("/usr/share/fonts/truetype/dejavu")
SIZE = 15
BG = (24, 26, 33)
FG = (220, 223, 228)
PALETTE = [
    (40, 42, 54), (232, 92, 92), (120, 200, 120), (230, 200, 90), (100, 150, 240), (200, 120, 220), (90, 200, 210),
    (220, 223, 228), (110, 115, 130), (255, 120, 120), (150, 230, 150), (250, 225, 120), (130, 175, 255),
    (225, 150, 245), (120, 225, 235), (255, 255, 255),
]
ESCAPE = re.compile(r"\x1b\[([0-9;]*)([A-Za-z])|\x1b[()][A-Za-z0-9]|\x1b.")


def _xterm256(n: int) -> tuple[int, int, int]:
    if n < 16:
        return PALETTE[n]
    if n < 232:
        n -= 16
        steps = (0, 95, 135, 175, 215, 255)
        return steps[n // 36], steps[(n // 6) % 6], steps[n % 6]
    level = 8 + 10 * (n - 232)
    return level, level, level


class Style:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.fg: tuple[int, int, int] | None = None
        self.bg: tuple[int, int, int] | None = None
        self.bold = self.dim = self.reverse = False

    def apply(self, params: str) -> None:
        codes = [int(c) if c else 0 for c in params.split(";")] if params else [0]
        i = 0
        while i < len(codes):
            c = codes[i]
            if c == 0:
                self.reset()
            elif c == 1:
                self.bold = True
            elif c == 2:
                self.dim = True
            elif c == 22:
                self.bold = self.dim = False
            elif c == 7:
                self.reverse = True
            elif c == 27:
                self.reverse = False
            elif 30 <= c <= 37 or 90 <= c <= 97:
                self.fg = PALETTE[c - 30 if c < 90 else c - 90 + 8]
            elif 40 <= c <= 47 or 100 <= c <= 107:
                self.bg = PALETTE[c - 40 if c < 100 else c - 100 + 8]
            elif c == 39:
                self.fg = None
            elif c == 49:
                self.bg = None
            elif c in (38, 48) and i + 1 < len(codes):
                if codes[i + 1] == 5 and i + 2 < len(codes):
                    color, i = _xterm256(codes[i + 2]), i + 2
                elif codes[i + 1] == 2 and i + 4 < len(codes):
                    color, i = (codes[i + 2], codes[i + 3], codes[i + 4]), i + 4
                else:
                    color = FG
                if c == 38:
                    self.fg = color
                else:
                    self.bg = color
            i += 1

    def colours(self) -> tuple[tuple[int, int, int], tuple[int, int, int] | None]:
        fg = self.fg or FG
        if self.bold and self.fg in PALETTE[:8]:
            fg = PALETTE[PALETTE.index(self.fg) + 8]
        if self.dim:
            fg = tuple(int(v * 0.6 + b * 0.4) for v, b in zip(fg, BG, strict=False))  # type: ignore[assignment]
        if self.reverse:
            return self.bg or BG, fg
        return fg, self.bg


def render(text: str, out: Path, *, pad: int = 14) -> None:
    regular = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono.ttf"), SIZE)
    bold = ImageFont.truetype(str(FONT_DIR / "DejaVuSansMono-Bold.ttf"), SIZE)
    lines = text.rstrip("\n").split("\n")
    while lines and not ESCAPE.sub("", lines[-1]).strip():
        lines.pop()
    cell_w = round(regular.getlength("M"))
    ascent, descent = regular.getmetrics()
    cell_h = ascent + descent + 3
    columns = max((len(ESCAPE.sub("", line)) for line in lines), default=1)
    image = Image.new("RGB", (columns * cell_w + 2 * pad, len(lines) * cell_h + 2 * pad), BG)
    draw = ImageDraw.Draw(image)
    style = Style()
    for row, line in enumerate(lines):
        col = 0
        at = 0
        for match in list(ESCAPE.finditer(line)) + [None]:
            chunk = line[at : match.start() if match else len(line)]
            fg, bg = style.colours()
            for ch in chunk:
                x, y = pad + col * cell_w, pad + row * cell_h
                if bg is not None:
                    draw.rectangle((x, y, x + cell_w, y + cell_h), fill=bg)
                if ch != " ":
                    draw.text((x, y + 1), ch, font=bold if style.bold else regular, fill=fg)
                col += 1
            if match is None:
                break
            if match.group(2) == "m":
                style.apply(match.group(1))
            at = match.end()
    image.save(out)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    render(Path(sys.argv[1]).read_text(errors="replace"), Path(sys.argv[2]))
