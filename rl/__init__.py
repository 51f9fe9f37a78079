"""Learned comparators: action-mode wrappers, SB3 training, and trained agents as policies (extra ``rl``)."""

from servegym.rl.wrappers import MODES, AdmitCount, AdmitMask, TokenWindow, count_action, window_action, wrap

__all__ = ["MODES", "AdmitCount", "AdmitMask", "TokenWindow", "count_action", "window_action", "wrap"]
