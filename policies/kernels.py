# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The admission arithmetic's inner loops, compiled like the engine (Cython's pure-Python mode).

``pip install`` compiles this module (``setup.py``); without a C compiler the same source runs as Python, with the
same results: every value here is a whole number of tokens (read from the observation's float32 rows, exact below
2**24, and summed in float64 or int64), so sums and comparisons do not depend on the order they are done in.
:func:`servegym.policies.common.longest_feasible_prefix` is the documented rule; this module is its loop. After
editing this file, ``pip install -e .`` rebuilds it.
"""

import cython

from servegym.envs.observation import QUEUE_INDEX, RUNNING_INDEX

COMPILED: bool = cython.compiled
"""True where this module runs compiled."""

Q_WIDTH = cython.declare(cython.Py_ssize_t, len(QUEUE_INDEX))
Q_PROMPT = cython.declare(cython.Py_ssize_t, QUEUE_INDEX["num_prompt_tokens"])
Q_GEN = cython.declare(cython.Py_ssize_t, QUEUE_INDEX["num_generated"])
Q_HI = cython.declare(cython.Py_ssize_t, QUEUE_INDEX["output_hi"])
R_WIDTH = cython.declare(cython.Py_ssize_t, len(RUNNING_INDEX))
R_PROMPT = cython.declare(cython.Py_ssize_t, RUNNING_INDEX["num_prompt_tokens"])
R_GEN = cython.declare(cython.Py_ssize_t, RUNNING_INDEX["num_generated"])
R_HI = cython.declare(cython.Py_ssize_t, RUNNING_INDEX["output_hi"])


@cython.ccall
@cython.boundscheck(True)  # ``order`` comes from the caller: a slot out of range is an IndexError, not a stray read
def fitting_count(queue: cython.float[::1], order: cython.longlong[::1], hits: cython.double[::1],
                  block: cython.longlong, budget_blocks: cython.double, slots: cython.Py_ssize_t) -> cython.Py_ssize_t:
    """How many waiting requests, taken in ``order`` (queue slots of the flat ``obs["queue"]`` rows), fit now: the
    longest prefix of at most ``slots`` whose KV blocks (prompt, tokens to recompute and the first token, less the
    whole blocks ``hits[k]`` GPU-cached tokens of ``order[k]``'s prompt fill) stay within ``budget_blocks``. It
    stops at the first request that does not fit."""
    k: cython.Py_ssize_t
    row: cython.Py_ssize_t
    count: cython.Py_ssize_t = 0
    used: cython.longlong = 0
    tokens: cython.longlong
    for k in range(order.shape[0]):
        row = order[k] * Q_WIDTH
        tokens = cython.cast(cython.longlong, queue[row + Q_PROMPT] + queue[row + Q_GEN]) + 1
        used += (tokens + block - 1) // block - cython.cast(cython.longlong, hits[k]) // block
        if count == slots or used > budget_blocks:
            break
        count += 1
    return count


@cython.ccall
@cython.boundscheck(True)
def upper_bound_count(queue: cython.float[::1], order: cython.longlong[::1], hits: cython.double[::1],
                      block: cython.longlong, budget_blocks: cython.double, slots: cython.Py_ssize_t,
                      running: cython.float[::1], run_left: cython.double[::1], left: cython.double[::1],
                      capacity: cython.double, scratch: cython.double[:, ::1]) -> cython.Py_ssize_t:
    """The score rule's count: of the requests that fit now (:func:`fitting_count`), the longest prefix that keeps
    the projected peak within ``capacity`` tokens (:func:`feasible_count`, ``block - 1`` tokens of slack per
    request), the running requests' tokens left ``run_left`` and the queue slots' ``left`` (indexed by slot).

    ``running`` is the flat ``obs["running"]``, its first ``len(run_left)`` rows live; ``scratch`` is
    ``(5, len(run_left) + len(order))`` floats, overwritten."""
    fit: cython.Py_ssize_t = fitting_count(queue, order, hits, block, budget_blocks, slots)
    if fit == 0:
        return 0
    num_run: cython.Py_ssize_t = run_left.shape[0]
    k: cython.Py_ssize_t
    row: cython.Py_ssize_t
    for k in range(num_run):  # tokens each running request holds now
        row = k * R_WIDTH
        scratch[0, k] = running[row + R_PROMPT] + running[row + R_GEN]
    for k in range(fit):  # the candidates that fit now, in order: tokens held now, tokens left
        row = order[k] * Q_WIDTH
        scratch[1, k] = queue[row + Q_PROMPT] + queue[row + Q_GEN]
        scratch[2, k] = left[order[k]]
    return feasible_count(scratch[0, :num_run], run_left, scratch[1, :fit], scratch[2, :fit],
                          scratch[3, :num_run + fit], scratch[4, :num_run + fit],
                          block - 1, capacity)


@cython.ccall
@cython.boundscheck(True)
def score_admit(queue: cython.float[::1], running: cython.float[::1], hits: cython.double[::1],
                scores: cython.double[::1], visible: cython.Py_ssize_t, num_run: cython.Py_ssize_t,
                block: cython.longlong, budget_blocks: cython.double, slots: cython.Py_ssize_t,
                capacity: cython.double, order: cython.longlong[::1], action: cython.longlong[::1],
                scratch: cython.double[:, ::1]) -> cython.Py_ssize_t:
    """The score rule in one pass (:func:`servegym.policies.common.admit_by_score` documents it): the first
    ``visible`` queue slots ranked by ``scores``, highest first, ties in queue order; how many of them, in that
    order, :func:`upper_bound_count` admits with every request's tokens left at its upper bound (at least 1);
    ``action`` gets their ranks (1 first, 0 elsewhere). Returns the count, or -1 (``action`` untouched) when a
    visible slot's score is not finite.

    ``hits`` holds each visible slot's GPU-cached prompt tokens, ``order`` at least ``visible`` slots and
    ``scratch`` ``(8, num_run + visible)`` floats: both overwritten."""
    k: cython.Py_ssize_t
    j: cython.Py_ssize_t
    row: cython.Py_ssize_t
    score: cython.double
    for k in range(visible):
        score = scores[k]
        if not abs(score) <= 1.7976931348623157e308:  # NaN or +-inf (compares false, or above the largest float)
            return -1
    for k in range(visible):  # insertion sort, stable: a slot passes only the strictly lower scores
        score = scores[k]
        j = k
        while j > 0 and scores[order[j - 1]] < score:
            order[j] = order[j - 1]
            j -= 1
        order[j] = k
    for k in range(num_run):
        row = k * R_WIDTH
        scratch[5, k] = max(cython.cast(cython.double, running[row + R_HI] - running[row + R_GEN]), 1.0)
    for k in range(visible):
        row = k * Q_WIDTH
        scratch[6, k] = max(cython.cast(cython.double, queue[row + Q_HI] - queue[row + Q_GEN]), 1.0)
        scratch[7, k] = hits[order[k]]
    count: cython.Py_ssize_t = upper_bound_count(queue, order[:visible], scratch[7, :visible], block, budget_blocks,
                                                 slots, running, scratch[5, :num_run], scratch[6, :visible],
                                                 capacity, scratch[:5])
    for k in range(action.shape[0]):
        action[k] = 0
    for k in range(count):
        action[order[k]] = k + 1
    return count


@cython.ccall
def feasible_count(run_current: cython.double[::1], run_left: cython.double[::1], current: cython.double[::1],
                   left: cython.double[::1], times: cython.double[::1], acc: cython.double[::1],
                   slack: cython.double, capacity: cython.double) -> cython.Py_ssize_t:
    """How many of the candidates (``current`` tokens held now, ``left`` tokens still to generate, in order) can
    join the running requests (``run_current``, ``run_left``) with the projected peak plus ``slack`` tokens per
    request within ``capacity``: the first prefix that fails, or all of them.

    A request holding ``c`` tokens with ``r`` left holds ``c + t`` tokens ``t`` steps from now while ``t <= r``; a
    set's peak is at one of its members' completion times, so each prefix's peak is the largest, over every
    request's completion time ``t`` (``times``: the running requests' then the candidates'), of the sum of
    ``c + t`` over the prefix's and the running requests still alive at ``t``. ``times`` and ``acc`` are scratch
    buffers of ``len(run_left) + len(left)`` values (``acc`` is overwritten).
    """
    num_run: cython.Py_ssize_t = run_left.shape[0]
    num_cand: cython.Py_ssize_t = left.shape[0]
    num_times: cython.Py_ssize_t = num_run + num_cand
    i: cython.Py_ssize_t
    k: cython.Py_ssize_t
    t: cython.Py_ssize_t
    at: cython.double
    total: cython.double
    peak: cython.double
    for t in range(num_run):
        times[t] = run_left[t]
    for k in range(num_cand):
        times[num_run + k] = left[k]
    for t in range(num_times):  # the running batch's tokens at each completion time
        at = times[t]
        total = 0.0
        for i in range(num_run):
            if run_left[i] >= at:
                total += run_current[i] + at
        acc[t] = total
    for k in range(num_cand):  # add candidate k at every time it is still alive; the prefix's peak
        peak = 0.0
        for t in range(num_times):
            at = times[t]
            if left[k] >= at:
                acc[t] += current[k] + at
            if acc[t] > peak:
                peak = acc[t]
        if peak + slack * (num_run + k + 1) > capacity:
            return k
    return num_cand
