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

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from servegym.engine import EngineBase, EpisodeLog

WIDTH = 640
HEADER = 28
PANEL = 120
KV_COLUMNS, KV_ROWS, KV_CELL = 120, 6, 4
"""The KV grid: 120 x 6 cells of 4 x 4 pixels (720 cells)."""
QUEUE_SLOTS, QUEUE_COLUMN, QUEUE_HEIGHT = 32, 8, 48
MAX_SCALE_TOKENS = 4096
"""The queue's columns saturate at this many tokens (prompt plus predicted output)."""

BACKGROUND = (24, 24, 28)
FREE = (60, 60, 66)
DECODING = (76, 175, 80)
PREFILLING = (255, 152, 0)
PROMPT = (66, 133, 244)
PREDICTED = (171, 71, 188)
TEXT = (230, 230, 230)
STATE_COLOURS = {"running": DECODING, "idle": (120, 144, 156), "loading": (255, 213, 79), "cold": (3, 169, 244)}
KV_COLOURS = np.array([FREE, DECODING, PREFILLING], dtype=np.uint8)
"""Cell colour by owner: 0 free, 1 decoding, 2 prefilling."""

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


def panel_of(engine: EngineBase, log: EpisodeLog, queue_window: int, now: float) -> PanelView:
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


def text(img: np.ndarray, x: int, y: int, string: str, scale: int = 2, colour: tuple[int, int, int] = TEXT) -> None:
    """Draw ``string`` (characters of the bitmap font; others as blanks) with its top-left corner at (x, y)."""
    for i, ch in enumerate(string):
        glyph = np.array([int(b) for b in _GLYPHS.get(ch, _GLYPHS[" "])], dtype=bool).reshape(5, 3)
        pixels = np.kron(glyph, np.ones((scale, scale), dtype=bool))
        left = x + i * 4 * scale
        region = img[y : y + pixels.shape[0], left : left + pixels.shape[1]]
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
    img[top : top + 16, 8:24] = STATE_COLOURS[view.state]
    text(img, 30, top + 3, f"c{index}")
    # KV grid.
    cells, _ = kv_cells(view)
    grid = KV_COLOURS[cells.reshape(KV_ROWS, KV_COLUMNS)]
    block = np.kron(grid, np.ones((KV_CELL, KV_CELL, 1), dtype=np.uint8))
    block[KV_CELL - 1 :: KV_CELL, :] //= 2  # a darker line between cell rows
    kv_top, kv_left = top + 22, 8
    img[kv_top : kv_top + block.shape[0], kv_left : kv_left + block.shape[1]] = block
    used = int(view.kv_blocks.sum())
    text(img, kv_left + block.shape[1] + 8, kv_top, f"k{used}", scale=2)
    text(img, kv_left + block.shape[1] + 8, kv_top + 14, f"/{view.num_kv_blocks}", scale=2)
    # Batch bar: decode then prefill tokens against the budget.
    bar_top, bar_width = kv_top + block.shape[0] + 6, KV_COLUMNS * KV_CELL
    img[bar_top : bar_top + 8, kv_left : kv_left + bar_width] = FREE
    budget = max(view.token_budget, 1)
    decode = min(bar_width, round(bar_width * view.decode_tokens / budget))
    prefill = min(bar_width - decode, round(bar_width * view.prefill_tokens / budget))
    img[bar_top : bar_top + 8, kv_left : kv_left + decode] = DECODING
    img[bar_top : bar_top + 8, kv_left + decode : kv_left + decode + prefill] = PREFILLING
    # Queue: prompt (bottom) and predicted output (above) per visible request.
    q_top, q_left = bar_top + 14, 8
    shown = min(view.queue_prompt.size, QUEUE_SLOTS)
    for i in range(shown):
        prompt, predicted = float(view.queue_prompt[i]), float(view.queue_predicted[i])
        p = min(QUEUE_HEIGHT, round(QUEUE_HEIGHT * prompt / MAX_SCALE_TOKENS) + 1)
        o = min(QUEUE_HEIGHT - p, round(QUEUE_HEIGHT * predicted / MAX_SCALE_TOKENS))
        x = q_left + i * (QUEUE_COLUMN + 2)
        bottom = q_top + QUEUE_HEIGHT
        img[bottom - p : bottom, x : x + QUEUE_COLUMN] = PROMPT
        img[bottom - p - o : bottom - p, x : x + QUEUE_COLUMN] = PREDICTED
    text(img, q_left + QUEUE_SLOTS * (QUEUE_COLUMN + 2) + 8, q_top + QUEUE_HEIGHT - 10, f"#{view.queue_prompt.size}")


def draw_frame(clock_s: float, step: int, panels: list[PanelView]) -> np.ndarray:
    """The frame of one step: ``(HEADER + PANEL x containers, WIDTH, 3)`` uint8."""
    img = np.empty(frame_shape(len(panels)), dtype=np.uint8)
    img[:] = BACKGROUND
    text(img, 8, 6, f"t={clock_s:.3f}s", scale=3)
    text(img, 360, 6, f"#{step}", scale=3)
    for i, view in enumerate(panels):
        top = HEADER + PANEL * i
        img[top, :] = FREE
        draw_panel(img, top + 4, i, view)
    return img
