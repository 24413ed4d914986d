"""How much to trust an evaluation: 95% intervals for proportions and for paired changes, on the same items.

- :func:`wilson`: the Wilson score interval for k successes in n items (good coverage at small n and
  near 0 or 1, where the usual p +- 1.96 SE collapses to a point).
- :func:`paired_change`: after - before on the same items, with Newcombe's hybrid score interval for
  paired proportions (1998, method 10) and the exact McNemar p-value (a two-sided binomial test on the
  items that changed). Only discordant items carry information: 7/32 -> 9/32 is nothing if it is two
  lucky flips.
- :func:`seed_mean` and :func:`welch_p`: one config run with several seeds (a sweep's confirmation runs):
  the mean with its t-interval, and Welch's two-sample t-test of two configs' seed values.

scipy.stats computes the intervals and tests; only Newcombe's paired interval, which scipy lacks, is
written here (from the Wilson limits of each margin).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054  # the two-sided 95% normal quantile
ALPHA = 0.05  # p below this: a difference, at the 95% level the intervals use


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a proportion (scipy.stats.binomtest); (nan, nan) for n = 0."""
    if n <= 0:
        return (math.nan, math.nan)
    from scipy import stats

    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=1 - 2 * stats.norm.sf(z), method="wilson")
    low = 0.0 if successes <= 0 else max(0.0, float(ci.low))  # exact at the ends, not 1e-17 off
    high = 1.0 if successes >= n else min(1.0, float(ci.high))
    return (low, high)


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value: b items went 1 -> 0, c went 0 -> 1; under no change each is a coin flip
    (a two-sided binomial test of b among the b + c changed items, scipy.stats.binomtest)."""
    if b + c == 0:
        return 1.0
    from scipy import stats

    return float(stats.binomtest(b, b + c, 0.5).pvalue)


@dataclass(frozen=True)
class PairedChange:
    """after - before over the same n items (each 0 or 1)."""

    n: int
    before: float
    after: float
    change: float
    ci_low: float
    ci_high: float
    p_value: float
    gained: int  # items 0 -> 1
    lost: int  # items 1 -> 0


def paired_change(before: Sequence[bool], after: Sequence[bool], z: float = Z95) -> PairedChange:
    """The change of a proportion measured twice on the same items, with its interval and McNemar p-value."""
    if len(before) != len(after):
        raise ValueError(f"paired items differ in number: {len(before)} before, {len(after)} after")
    n = len(before)
    both = sum(1 for x, y in zip(before, after, strict=True) if x and y)
    lost = sum(1 for x, y in zip(before, after, strict=True) if x and not y)
    gained = sum(1 for x, y in zip(before, after, strict=True) if not x and y)
    neither = n - both - lost - gained
    if n == 0:
        return PairedChange(0, math.nan, math.nan, math.nan, math.nan, math.nan, 1.0, 0, 0)
    p1, p2 = (both + lost) / n, (both + gained) / n
    (l1, u1), (l2, u2) = wilson(both + lost, n, z), wilson(both + gained, n, z)
    margins = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    # The correlation of the pairs, shrunk as Newcombe does (ad - bc - n/2 when positive): unshrunk, items that
    # never changed would give a zero-width interval, as if the change were known exactly.
    concordance = both * neither - lost * gained
    if concordance > 0:
        concordance = max(concordance - n / 2, 0.0)
    phi = concordance / math.sqrt(margins) if margins > 0 else 0.0
    change = p2 - p1
    down = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    up = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return PairedChange(
        n=n,
        before=p1,
        after=p2,
        change=change,
        ci_low=max(-1.0, change - down),
        ci_high=min(1.0, change + up),
        p_value=mcnemar_exact(lost, gained),
        gained=gained,
        lost=lost,
    )


def detectable_difference(n: int, p: float = 0.5, z: float = Z95) -> float:
    """Roughly the smallest change of a proportion near `p` that n items can tell from noise at 95% (two
    independent measurements; paired ones on the same items do somewhat better)."""
    if n <= 0:
        return math.nan
    return z * math.sqrt(2 * p * (1 - p) / n)


@dataclass(frozen=True)
class SeedMean:
    """A config's objective over its seeds: the mean and its 95% t-interval (nan with one seed)."""

    n: int
    mean: float
    ci_low: float
    ci_high: float


def seed_mean(values: Sequence[float]) -> SeedMean:
    """The mean of `values` (one per seed) with the 95% interval of Student's t on n - 1 degrees of freedom."""
    import statistics

    from scipy import stats

    n = len(values)
    if n == 0:
        return SeedMean(0, math.nan, math.nan, math.nan)
    mean = statistics.fmean(values)
    if n == 1:
        return SeedMean(1, mean, math.nan, math.nan)
    half = float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * statistics.stdev(values) / math.sqrt(n)
    return SeedMean(n, mean, mean - half, mean + half)


def welch_p(a: Sequence[float], b: Sequence[float]) -> float:
    """Two-sided p-value that two configs' seed values have the same mean (Welch's t-test: no equal-variance
    assumption). Needs two values on each side (nan otherwise); values without spread on both sides give 1.0
    when the means are equal and 0.0 when they differ (the t statistic is infinite)."""
    from scipy import stats

    if len(a) < 2 or len(b) < 2:
        return math.nan
    if max(a) == min(a) and max(b) == min(b):
        return 1.0 if a[0] == b[0] else 0.0
    return float(stats.ttest_ind(a, b, equal_var=False).pvalue)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from n samples of which c pass (Chen et al. 2021, "Evaluating Large Language
    Models Trained on Code"): 1 - C(n - c, k) / C(n, k), the chance that k of the n samples hold a pass.

    >>> pass_at_k(10, 0, 5), pass_at_k(10, 10, 1), pass_at_k(4, 1, 1), round(pass_at_k(10, 1, 5), 3)
    (0.0, 1.0, 0.25, 0.5)
    """
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))
