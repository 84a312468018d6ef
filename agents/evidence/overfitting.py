"""Overfitting statistics: how much of a backtest's Sharpe ratio survives the search that found it.

- ``probabilistic_sharpe_ratio`` / ``psr_from_moments`` (PSR; Bailey & López de Prado 2012,
  "The Sharpe Ratio Efficient Frontier"): the probability that the true Sharpe ratio exceeds a
  benchmark, given how long the track record is and how skewed and fat-tailed its returns are.
- ``expected_max_sharpe`` (the False Strategy theorem; Bailey & López de Prado 2014, "The Deflated
  Sharpe Ratio"): the Sharpe ratio that the best of N skill-less trials reaches on average.
- ``deflated_sharpe_ratio`` / ``dsr_from_moments`` (DSR, same paper): the PSR against that
  expected maximum, i.e. the probability that the selected trial's Sharpe ratio beats what the
  search alone would have produced.
- ``pbo_cscv`` (PBO; Bailey, Borwein, López de Prado & Zhu 2017, "The Probability of Backtest
  Overfitting"): by combinatorially symmetric cross-validation, how often the configuration that is
  best in-sample ranks at or below the median out-of-sample.

Units: every Sharpe ratio here is per period and not annualised: mean over standard deviation of
per-period returns or P&L, one period being what one row covers (in this gym, one trading
session). An annualised Sharpe ratio converts by dividing by sqrt(periods per year), the variance
of Sharpe estimates by dividing by periods per year. Skewness and kurtosis are the sample
moment ratios m3 / m2^1.5 and m4 / m2^2 the papers use; kurtosis is not excess (3 for a normal).
PSR, DSR and PBO are probabilities in [0, 1].
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import numpy as np
from scipy import stats

EULER_GAMMA = float(np.euler_gamma)


def psr_from_moments(sr: float, n: int, skew: float, kurtosis: float, benchmark_sr: float = 0.0) -> float:
    """PSR from summary statistics: per-period Sharpe ``sr`` over ``n`` periods, skewness and kurtosis."""
    if n < 3:
        return math.nan
    spread = 1.0 - skew * sr + (kurtosis - 1.0) / 4.0 * sr**2
    # every distribution has kurtosis >= 1 + skew², which keeps this positive but for degenerate cases
    if not spread > 0.0:
        return math.nan
    return float(stats.norm.cdf((sr - benchmark_sr) * math.sqrt(n - 1) / math.sqrt(spread)))


def _sharpe_and_moments(returns) -> tuple[float, int, float, float]:
    """Per-period Sharpe (sample std), length, skewness and kurtosis of a return series; nan if undefined."""
    r = np.asarray(returns, dtype=float).ravel()
    if r.size < 3 or not np.ptp(r) > 0.0:
        return math.nan, int(r.size), math.nan, math.nan
    sharpe = float(r.mean() / r.std(ddof=1))
    return sharpe, int(r.size), float(stats.skew(r)), float(stats.kurtosis(r, fisher=False))


def probabilistic_sharpe_ratio(returns, benchmark_sr: float = 0.0) -> float:
    """Probability that the true per-period Sharpe ratio of ``returns`` exceeds ``benchmark_sr``.

    ``returns`` holds one return (or P&L) per period; ``benchmark_sr`` is per period too. Returns nan
    for fewer than 3 periods or returns that never change.
    """
    sr, n, skew, kurtosis = _sharpe_and_moments(returns)
    return psr_from_moments(sr, n, skew, kurtosis, benchmark_sr)


def expected_max_sharpe(trials: int, variance: float) -> float:
    """Expected maximum Sharpe estimate of ``trials`` independent trials whose true Sharpe is 0.

    ``variance`` is the variance of the trials' Sharpe estimates (per period). 0 for one trial.
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if variance < 0:
        raise ValueError(f"variance must be non-negative, got {variance}")
    if trials == 1:
        return 0.0
    # the expected maximum of N standard normals, by extreme value theory with the Euler–Mascheroni constant
    tail = stats.norm.ppf([1.0 - 1.0 / trials, 1.0 - 1.0 / (trials * math.e)])
    max_of_standard_normals = (1.0 - EULER_GAMMA) * tail[0] + EULER_GAMMA * tail[1]
    return float(math.sqrt(variance) * max_of_standard_normals)


def dsr_from_moments(sr: float, n: int, skew: float, kurtosis: float, trials: int, variance: float) -> dict:
    """DSR from summary statistics: the PSR of ``sr`` against the expected maximum of ``trials`` null trials."""
    sr_star = expected_max_sharpe(trials, variance)
    return {
        "dsr": psr_from_moments(sr, n, skew, kurtosis, sr_star),
        "psr": psr_from_moments(sr, n, skew, kurtosis, 0.0),
        "sharpe": sr,
        "sr_star": sr_star,
        "trials": trials,
        "variance": variance,
        "n": n,
    }


def deflated_sharpe_ratio(returns, trials: int, trial_sr_variance: float | None = None) -> dict:
    """DSR of the selected trial's ``returns`` after ``trials`` trials were tried.

    ``trial_sr_variance`` is the variance of the trials' per-period Sharpe estimates. Without it,
    the variance of one Sharpe estimate under the null of zero Sharpe, 1 / (n - 1), stands in:
    what independent skill-less trials over the same n periods would show. ``variance_from`` says
    which was used ("trials" or "null"). Keys: dsr, psr (against 0), sharpe, sr_star, trials,
    variance, variance_from, n.
    """
    sr, n, skew, kurtosis = _sharpe_and_moments(returns)
    if trial_sr_variance is None:
        variance, variance_from = (1.0 / (n - 1) if n >= 3 else math.nan), "null"
    else:
        variance, variance_from = float(trial_sr_variance), "trials"
    result = dsr_from_moments(sr, n, skew, kurtosis, trials, variance)
    result["variance_from"] = variance_from
    return result


def per_period_sharpe(pnl: np.ndarray) -> np.ndarray:
    """Each column's Sharpe ratio, mean over sample std of its per-period P&L; 0 for a column that never changes."""
    pnl = np.asarray(pnl, dtype=float)
    moving = np.ptp(pnl, axis=0) > 0.0
    mean = pnl.mean(axis=0)
    # a single row never moves, so its placeholder std is never divided by
    std = pnl.std(axis=0, ddof=1) if pnl.shape[0] > 1 else np.ones_like(mean)
    return np.divide(mean, std, out=np.zeros_like(mean), where=moving)


def _scores(metric: Callable[[np.ndarray], np.ndarray], rows: np.ndarray) -> np.ndarray:
    """The metric of every trial on these rows, as floats; a trial without a defined metric ranks last."""
    values = np.asarray(metric(rows), dtype=float)
    if values.shape != (rows.shape[1],):
        raise ValueError(f"metric must return one value per trial, shape ({rows.shape[1]},); got {values.shape}")
    return np.where(np.isnan(values), -np.inf, values)


def _sampled_splits(blocks: int, count: int, seed: int) -> list[tuple[int, ...]]:
    """``count`` distinct in-sample block sets of size blocks / 2, drawn reproducibly from ``seed``."""
    rng = np.random.default_rng(seed)
    chosen: set[tuple[int, ...]] = set()
    while len(chosen) < count:
        chosen.add(tuple(sorted(rng.choice(blocks, size=blocks // 2, replace=False).tolist())))
    return sorted(chosen)


def _average_rank(values: np.ndarray, index: int) -> float:
    """Ascending rank (1 = worst) of ``values[index]`` among ``values``, ties sharing their average rank."""
    value = values[index]
    return float(np.sum(values < value) + (np.sum(values == value) + 1) / 2)


def _degradation(is_metric: np.ndarray, oos_metric: np.ndarray) -> dict:
    """Least-squares slope and intercept of the selected trials' OOS metric on their IS metric."""
    finite = np.isfinite(is_metric) & np.isfinite(oos_metric)
    x, y = is_metric[finite], oos_metric[finite]
    if x.size < 2 or not np.ptp(x) > 0.0:
        return {"slope": math.nan, "intercept": math.nan}
    slope = float(np.sum((x - x.mean()) * (y - y.mean())) / np.sum((x - x.mean()) ** 2))
    return {"slope": slope, "intercept": float(y.mean() - slope * x.mean())}


def pbo_cscv(
    performance: np.ndarray,
    blocks: int = 16,
    metric: Callable[[np.ndarray], np.ndarray] = per_period_sharpe,
    max_combinations: int = 5000,
    seed: int = 0,
) -> dict:
    """Probability of Backtest Overfitting by combinatorially symmetric cross-validation.

    ``performance`` is T × N: rows are periods in time order, columns the N trials (e.g. each arm ×
    seed of a walk-forward), values per-period P&L. The rows are cut into ``blocks`` contiguous
    blocks; every choice of half of them is in-sample and the rest out-of-sample (at most
    ``max_combinations`` choices, drawn with ``seed`` when there are more). ``metric`` maps a
    rows × N slice to N scores, higher is better (default: per-period Sharpe). For each choice, the
    in-sample best trial (lowest column on ties) gets its out-of-sample rank r among the N trials
    (average rank on ties), ω = r / (N + 1) and logit λ = ln(ω / (1 - ω)); PBO is the share of
    choices with λ ≤ 0. Also returned: the logits, how many choices were used (``combinations``)
    out of ``total_combinations`` and whether they were ``sampled``, ``performance_degradation``
    (slope and intercept of the selected trials' OOS metric on their IS metric) and
    ``prob_oos_loss`` (share of choices whose selected trial has an OOS metric below 0).
    """
    perf = np.asarray(performance, dtype=float)
    if perf.ndim != 2:
        raise ValueError(f"performance must be a 2-D array (periods × trials), got shape {perf.shape}")
    periods, trials = perf.shape
    if trials < 2:
        raise ValueError(f"pbo_cscv needs at least 2 trials (columns), got {trials}")
    if blocks < 2 or blocks % 2:
        raise ValueError(f"blocks must be an even integer of at least 2, got {blocks}")
    if periods < blocks:
        raise ValueError(f"pbo_cscv needs at least as many periods (rows) as blocks: {periods} rows, {blocks} blocks")
    if max_combinations < 1:
        raise ValueError(f"max_combinations must be at least 1, got {max_combinations}")
    if not np.all(np.isfinite(perf)):
        raise ValueError("performance must be finite (no nan or inf)")

    # array_split sizes differ by at most one row when blocks does not divide T
    block_of_row = np.repeat(np.arange(blocks), [len(b) for b in np.array_split(np.arange(periods), blocks)])
    total = math.comb(blocks, blocks // 2)
    sampled = total > max_combinations
    splits = (
        _sampled_splits(blocks, max_combinations, seed)
        if sampled
        else list(itertools.combinations(range(blocks), blocks // 2))
    )

    logits, is_selected, oos_selected = [], [], []
    for split in splits:
        in_block = np.zeros(blocks, dtype=bool)
        in_block[list(split)] = True
        in_sample = in_block[block_of_row]
        is_metric = _scores(metric, perf[in_sample])
        oos_metric = _scores(metric, perf[~in_sample])
        best = int(np.argmax(is_metric))
        omega = _average_rank(oos_metric, best) / (trials + 1)
        logits.append(float(math.log(omega / (1.0 - omega))))
        is_selected.append(is_metric[best])
        oos_selected.append(oos_metric[best])

    logit_array, oos_array = np.array(logits), np.array(oos_selected)
    return {
        "pbo": float(np.mean(logit_array <= 0.0)),
        "logits": logits,
        "combinations": len(splits),
        "total_combinations": total,
        "blocks": blocks,
        "trials": trials,
        "sampled": sampled,
        "performance_degradation": _degradation(np.array(is_selected), oos_array),
        "prob_oos_loss": float(np.mean(oos_array < 0.0)),
    }
