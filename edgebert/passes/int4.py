"""The symmetric block-wise INT4 grid a word table is stored on in TFLite (and, with `PruneConfig.int4_words`,
trained on): each row cut into blocks, each block 15 levels (codes −7..7) of one scale.

ai-edge-quantizer takes a block's scale from its max-abs alone (rounded to bfloat16); on values already on
such a grid, with the scale bfloat16-exact, it lands on the same codes. So `int4_grid` picks each block's
scale for least squared error and the quantizer stores exactly that: nothing is rounded twice, and a table
moved onto its grid before training is the table the INT4 file holds.
"""

from __future__ import annotations

import torch

from ..errors import EdgebertError

BLOCK_SIZES = (32, 64, 128, 256)  # what both ORT's GatherBlockQuantized and ai-edge-quantizer's blockwise take


@torch.no_grad()
def int4_grid(w: torch.Tensor, block_size: int) -> torch.Tensor:
    """`w` [rows, cols] with each row's blocks of `block_size` values on a symmetric 4-bit grid: of the scales
    max-abs × 0.50, 0.52, … 1.00 / 7 (bfloat16-exact), the one with the least squared error. Idempotent."""
    rows, cols = w.shape
    if cols % block_size:
        raise EdgebertError(f"INT4 block size {block_size} does not divide the table's {cols} columns: "
                            "choose a block size that does")
    blocks = w.detach().float().reshape(rows, cols // block_size, block_size)
    top = blocks.abs().amax(dim=2, keepdim=True)
    best, error = blocks, torch.full(top.shape, float("inf"))
    for ratio in torch.linspace(0.5, 1.0, 26).tolist():
        scale = (top * ratio / 7).to(torch.bfloat16).to(torch.float16).float()
        grid = torch.clamp(torch.round(blocks / scale.clamp_min(1e-30)), -7, 7) * scale
        err = (grid - blocks).square().sum(dim=2, keepdim=True)
        better = err < error
        best, error = torch.where(better, grid, best), torch.where(better, err, error)
    return best.reshape(rows, cols).to(w.dtype)
