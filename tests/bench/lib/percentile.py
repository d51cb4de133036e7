# SPDX-License-Identifier: Apache-2.0
"""The percentile the bench scripts report (nearest rank)."""


def pct(xs, p):
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, round(p / 100 * len(xs) + 0.5) - 1))
    return xs[k]
