"""The penalty and its gradient from the kernels' per-row results (repcap_fast.ops.gram_offdiag_penalty).

The launchers return per row i the maximum m_i = max_{j≠i}|g_ij|, the scaled sum
s_i = Σ_{j≠i} (|g_ij|/m_i)^p and the direction Σ_{j≠i} sign(g_ij)(|g_ij|/m_i)^(p−1) x̂_j; here they
become L_i = m_i^p s_i and ∂L/∂x_i, with the factors m_i^p and m_i^(p−1) in float64 log space.
"""

from __future__ import annotations

import math

import torch


def _log_pow(m: torch.Tensor, e: int) -> torch.Tensor:
    """e·ln(m) in float64, -inf where m == 0 (so exp gives 0)."""
    return e * torch.log(m.to(torch.float64))


def _row_losses(row_max: torch.Tensor, row_sum: torch.Tensor, p: int) -> torch.Tensor:
    """L_i = m_i^p s_i in float64 (log space); rows with m_i = 0 (or s_i = 0) give 0."""
    terms = torch.exp(_log_pow(row_max, p) + torch.log(row_sum))
    return torch.where(row_sum > 0, terms, torch.zeros_like(terms))


def _finish_grad(grad_dir, row_max, x, norms, p: int, log_scale: float, sync_free: bool) -> torch.Tensor:
    """∂L/∂x in place of grad_dir.

    The chain rule (I − x̂x̂ᵀ) of the normalization (when norms is given) on the direction, then
    one per-row factor 2p·e^log_scale·m_i^(p−1)/‖x_i‖ formed in float64 log space. O(k·d), no k×d
    temporaries (except float64 row chunks where the factor exceeds float32, and always inside a
    CUDA graph capture, where its size cannot be read). sync_free: whether a CUDA graph is being
    captured on x's device (gram_offdiag_penalty._sync_free), so that no value may be read.
    """
    if norms is not None:
        radial = torch.bmm(grad_dir.unsqueeze(1), x.unsqueeze(2)).reshape(-1)  # dir_i·x̂_i
        grad_dir.addcmul_(x, radial[:, None], value=-1.0)
    log_coef = _log_pow(row_max, p - 1) + (math.log(2.0 * p) + log_scale)
    if norms is not None:
        log_coef = log_coef - torch.log(norms)
    coef = torch.where(row_max > 0, torch.exp(log_coef), torch.zeros_like(log_coef))
    if grad_dir.dtype == torch.float64 or (not sync_free and float(coef.max()) < 1e30):
        grad_dir.mul_(coef.to(grad_dir.dtype)[:, None])
    else:  # the factor alone overflows float32: multiply in float64, round each element once
        rows = max(1, (4 << 20) // (8 * grad_dir.shape[1]))
        for r0 in range(0, grad_dir.shape[0], rows):
            chunk = grad_dir[r0 : r0 + rows]
            chunk.copy_(chunk.to(torch.float64) * coef[r0 : r0 + rows, None])
    return grad_dir
