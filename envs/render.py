"""``render_mode="rgb_array"``: one frame per step, drawn with numpy alone.

A frame shows the clock and step at the top, then one panel per container of the pool:

- a swatch of the container's state (running, idle, loading its model, cold), with its index;
- the KV cache as a grid of cells, each standing for ``blocks_per_cell`` blocks, coloured by the state of the
  request that owns them (decoding, prefilling) or free; requests hold their blocks in activation order;
- the visible queue: one column per waiting request, its prompt length rising from the bottom and its
  predicted output length (the upper end of the interval policies observe) above it, both on one scale;
- this iteration's batch: decode tokens then prefill tokens against the token budget.

The frame's size depends only on the pool's size, so every frame of an episode has the same shape (what
``gymnasium.wrappers.RecordVideo`` needs). Nothing here reads the engine's private state: :class:`PanelView`
is what the env hands over.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from servegym.engine import Engine, EpisodeLog

WIDTH = 640
HEADER = 28
PANEL = 120
KV_COLUMNS, KV_ROWS, KV_CELL = 120, 6, 4
"""The KV grid: 120 x 6 cells of 4 x 4 pixels (720 cells)."""
QUEUE_SLOTS, QUEUE_COLUMN, QUEUE_HEIGHT = 32, 8, 48
MAX_SCALE_TOKENS = 4096
"""The queue's columns saturate at this many tokens (prompt plus predicted output)."""

def _rgb(r: int, g: int, b: int) -> int:
    """A colour packed as the frame's canvas holds it: one little-endian uint32 of R, G, B and an opaque alpha."""
    return r | g << 8 | b << 16 | 255 << 24


BACKGROUND = _rgb(24, 24, 28)
FREE = _rgb(60, 60, 66)
DECODING = _rgb(76, 175, 80)
PREFILLING = _rgb(255, 152, 0)
PROMPT = _rgb(66, 133, 244)
PREDICTED = _rgb(171, 71, 188)
TEXT = _rgb(230, 230, 230)
STATE_COLOURS = {"running": DECODING, "idle": _rgb(120, 144, 156), "loading": _rgb(255, 213, 79),
                 "cold": _rgb(3, 169, 244)}
_DARK = [_rgb(30, 30, 33), _rgb(38, 87, 40), _rgb(127, 76, 0)]
KV_COLOURS = np.array([FREE, DECODING, PREFILLING, *_DARK], dtype="<u4")
"""Cell colour by owner: 0 free, 1 decoding, 2 prefilling; 3-5 the same, darker (each cell row's last line)."""
QUEUE_COLOURS = np.array([BACKGROUND, PROMPT, PREDICTED], dtype="<u4")
"""A queue pixel's colour: 0 empty, 1 prompt, 2 predicted output."""
_KV_PIXELS = np.arange(KV_ROWS * KV_COLUMNS).reshape(KV_ROWS, KV_COLUMNS).repeat(KV_CELL, 0).repeat(KV_CELL, 1)
"""The cell each pixel of the KV grid shows."""
_KV_SHADE = np.where(np.arange(KV_ROWS * KV_CELL) % KV_CELL == KV_CELL - 1, 3, 0)[:, None]
"""Added to a cell's colour index on the last pixel line of each cell row."""

_GLYPHS = {
    "0": "111101101101111", "1": "010110010010111", "2": "111001111100111", "3": "111001111001111",
    "4": "101101111001001", "5": "111100111001111", "6": "111100111101111", "7": "111001001001001",
    "8": "111101111101111", "9": "111101111001111", ".": "000000000000010", "=": "000111000111000",
    "t": "010111010010011", "s": "000011110001110", "c": "000111100100111", "k": "100101110101101",
    "#": "101111101111101", " ": "000000000000000", "/": "001001010100100",
}
"""A 3 x 5 bitmap font (rows top to bottom, three pixels each) for the clock and counters."""


@dataclass(frozen=True)
class PanelView:
    """What one container's panel shows."""

    state: str
    """``running``, ``idle``, ``loading`` or ``cold``."""
    kv_blocks: np.ndarray
    """Blocks held by each running request, in activation order."""
    prefilling: np.ndarray
    """Per running request: still prefilling (bool)."""
    num_kv_blocks: int
    queue_prompt: np.ndarray
    """Prompt tokens of the visible waiting requests, queue head first."""
    queue_predicted: np.ndarray
    """Predicted output tokens of the same requests."""
    decode_tokens: int
    prefill_tokens: int
    token_budget: int


def panel_of(engine: Engine, log: EpisodeLog, queue_window: int, now: float) -> PanelView:
    """The panel of one container at time ``now`` (the cluster's clock): its public state only."""
    if engine.ready_at == math.inf:  # never loaded (a lone engine is loaded from -inf on)
        state = "cold"
    elif now < engine.ready_at:
        state = "loading"
    else:
        state = "running" if engine.num_running else "idle"
    running = engine.running
    kv_tokens, prefill_left = running[:, 1], running[:, 5]
    visible = engine.waiting[:queue_window]
    return PanelView(state, -(-kv_tokens // engine.block_size), prefill_left > 0, engine.num_kv_blocks,
                     log.num_prompt_tokens[visible], log.output_hi[visible], engine.last.num_decode_tokens,
                     engine.last.num_prefill_tokens, engine.config.max_num_batched_tokens)


def frame_shape(num_containers: int) -> tuple[int, int, int]:
    return HEADER + PANEL * num_containers, WIDTH, 3


@functools.cache
def _glyph(ch: str, scale: int) -> np.ndarray:
    """The bitmap of ``ch`` (a blank for characters the font lacks) and a blank column after it, each pixel
    ``scale`` x ``scale``."""
    bits = np.array([b == "1" for b in _GLYPHS.get(ch, _GLYPHS[" "])]).reshape(5, 3)
    bits = np.hstack([bits, np.zeros((5, 1), dtype=bool)])
    return bits.repeat(scale, axis=0).repeat(scale, axis=1)


def text(img: np.ndarray, x: int, y: int, string: str, scale: int = 2, colour: int = TEXT) -> None:
    """Draw ``string`` (characters of the bitmap font; others as blanks) with its top-left corner at (x, y)."""
    pixels = np.hstack([_glyph(ch, scale) for ch in string])
    region = img[y : y + pixels.shape[0], x : x + pixels.shape[1]]
    region[pixels[: region.shape[0], : region.shape[1]]] = colour


def kv_cells(view: PanelView, cells: int = KV_COLUMNS * KV_ROWS) -> tuple[np.ndarray, int]:
    """The owner state of each cell (0 free, 1 decoding, 2 prefilling) and the blocks per cell: the state of
    the cell's first block."""
    per_cell = max(1, math.ceil(view.num_kv_blocks / cells))
    owners = np.repeat(np.where(view.prefilling, 2, 1).astype(np.int8), view.kv_blocks.astype(np.int64))
    states = np.zeros(view.num_kv_blocks, dtype=np.int8)
    states[: min(owners.size, states.size)] = owners[: states.size]
    picked = states[::per_cell]
    out = np.zeros(cells, dtype=np.int8)
    out[: picked.size] = picked
    return out, per_cell


def draw_panel(img: np.ndarray, top: int, index: int, view: PanelView) -> None:
    img[top : top + 16, 8:24] = STATE_COLOURS[view.state]  # its name, "c<index>", is in the background
    # KV grid: a cell of KV_CELL x KV_CELL pixels per entry, the last pixel row of each cell row darker.
    cells, _ = kv_cells(view)
    grid = KV_COLOURS[cells[_KV_PIXELS] + _KV_SHADE]
    kv_top, kv_left = top + 22, 8
    img[kv_top : kv_top + grid.shape[0], kv_left : kv_left + grid.shape[1]] = grid
    used = int(view.kv_blocks.sum())
    text(img, kv_left + grid.shape[1] + 8, kv_top, f"k{used}", scale=2)  # over "/<capacity>" of the background
    # Batch bar: decode then prefill tokens against the budget.
    bar_top, bar_width = kv_top + grid.shape[0] + 6, KV_COLUMNS * KV_CELL  # its FREE background is static
    budget = max(view.token_budget, 1)
    decode = min(bar_width, round(bar_width * view.decode_tokens / budget))
    prefill = min(bar_width - decode, round(bar_width * view.prefill_tokens / budget))
    img[bar_top : bar_top + 8, kv_left : kv_left + decode] = DECODING
    img[bar_top : bar_top + 8, kv_left + decode : kv_left + decode + prefill] = PREFILLING
    # Queue: per visible request a column, its prompt rising from the bottom and its predicted output above.
    q_top, q_left = bar_top + 14, 8
    shown = min(view.queue_prompt.size, QUEUE_SLOTS)
    if shown:
        scale = QUEUE_HEIGHT / MAX_SCALE_TOKENS
        prompt = np.minimum(QUEUE_HEIGHT, np.round(view.queue_prompt[:shown] * scale).astype(np.int64) + 1)
        predicted = np.minimum(QUEUE_HEIGHT - prompt, np.round(view.queue_predicted[:shown] * scale).astype(np.int64))
        depth = QUEUE_HEIGHT - np.arange(QUEUE_HEIGHT)[:, None]  # pixels from the bottom, 1 at the last row
        colour = np.where(depth <= prompt, 1, np.where(depth <= prompt + predicted, 2, 0))  # (height, shown)
        columns = np.zeros((QUEUE_HEIGHT, shown, QUEUE_COLUMN + 2), dtype=np.int8)
        columns[:, :, :QUEUE_COLUMN] = colour[:, :, None]
        columns = columns.reshape(QUEUE_HEIGHT, -1)
        region = img[q_top : q_top + QUEUE_HEIGHT, q_left : q_left + columns.shape[1]]
        np.copyto(region, QUEUE_COLOURS[columns], where=columns > 0)
    text(img, q_left + QUEUE_SLOTS * (QUEUE_COLUMN + 2) + 8, q_top + QUEUE_HEIGHT - 10, f"#{view.queue_prompt.size}")


@functools.cache
def _background(capacities: tuple[int, ...]) -> np.ndarray:
    """The frame's static part on the packed canvas, for containers of these KV capacities: the background, a
    rule above each panel, each panel's name, capacity and empty batch bar."""
    img = np.full(frame_shape(len(capacities))[:2], BACKGROUND, dtype="<u4")
    for i, blocks in enumerate(capacities):
        top = HEADER + PANEL * i
        img[top, :] = FREE
        text(img, 30, top + 7, f"c{i}")
        kv_top = top + 4 + 22
        text(img, 8 + KV_COLUMNS * KV_CELL + 8, kv_top + 14, f"/{blocks}", scale=2)
        bar_top = kv_top + KV_ROWS * KV_CELL + 6
        img[bar_top : bar_top + 8, 8 : 8 + KV_COLUMNS * KV_CELL] = FREE
    img.flags.writeable = False
    return img


def draw_frame(clock_s: float, step: int, panels: list[PanelView]) -> np.ndarray:
    """The frame of one step: ``(HEADER + PANEL x containers, WIDTH, 3)`` uint8, a new array each call.

    It is drawn on a canvas of packed RGBA uint32 (one store a pixel) and returned as the RGB bytes of that canvas:
    a strided view, as copying three bytes of every four would cost more than the drawing
    (``np.ascontiguousarray`` it where contiguous memory is needed)."""
    img = _background(tuple(view.num_kv_blocks for view in panels)).copy()
    text(img, 8, 6, f"t={clock_s:.3f}s", scale=3)
    text(img, 360, 6, f"#{step}", scale=3)
    for i, view in enumerate(panels):
        draw_panel(img, HEADER + PANEL * i + 4, i, view)
    return img.view(np.uint8).reshape(*img.shape, 4)[:, :, :3]
