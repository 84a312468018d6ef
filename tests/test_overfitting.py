"""Overfitting statistics against the papers' worked examples, a hand-worked CSCV and simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from agents.evidence.overfitting import (
    deflated_sharpe_ratio,
    dsr_from_moments,
    expected_max_sharpe,
    pbo_cscv,
    per_period_sharpe,
    probabilistic_sharpe_ratio,
    psr_from_moments,
)

# Bailey & López de Prado (2014), "The Deflated Sharpe Ratio", section "A numerical example": the best
# of N = 100 trials has an annualised SR of 2.5 over 5 years of daily returns (T = 1250, 250 days a
# year), skewness -3, kurtosis 10, and the trials' annualised Sharpe ratios have variance 1/2. The
# paper de-annualises (SR / sqrt(250), V / 250) and prints SR* ≈ 0.1132 and DSR ≈ 0.9004.
PAPER_SR = 2.5 / math.sqrt(250)
PAPER_T = 1250
PAPER_SKEW = -3.0
PAPER_KURTOSIS = 10.0
PAPER_TRIALS = 100
PAPER_VARIANCE = 0.5 / 250


def mean_metric(rows: np.ndarray) -> np.ndarray:
    return rows.mean(axis=0)


def test_psr_reproduces_the_papers_worked_example():
    # the 2014 DSR is the PSR against SR*; the paper's 0.9004 uses SR* unrounded (0.113172), not 0.1132
    psr = psr_from_moments(PAPER_SR, PAPER_T, PAPER_SKEW, PAPER_KURTOSIS, benchmark_sr=0.113172)
    assert psr == pytest.approx(0.9004, abs=5e-5)


def test_psr_of_normal_returns_uses_the_classic_sharpe_standard_error():
    # skew 0 and kurtosis 3 leave 1 + SR²/2 in the denominator (Lo 2002)
    sr, n = 0.1, 101
    expected = norm.cdf(sr * math.sqrt(n - 1) / math.sqrt(1 + sr**2 / 2))
    assert psr_from_moments(sr, n, 0.0, 3.0) == pytest.approx(expected, rel=1e-12)


def test_psr_falls_with_negative_skew_and_fat_tails():
    normal = psr_from_moments(0.1, 250, 0.0, 3.0)
    skewed = psr_from_moments(0.1, 250, -2.0, 3.0 + 4.0 + 1.0)
    assert skewed < normal


def test_psr_from_returns_uses_per_period_sharpe_and_raw_moments():
    rng = np.random.default_rng(7)
    returns = 0.05 + rng.standard_t(df=5, size=400) - 0.3 * rng.exponential(size=400)
    centred = returns - returns.mean()
    m2, m3, m4 = (np.mean(centred**k) for k in (2, 3, 4))
    sr = returns.mean() / returns.std(ddof=1)
    expected = psr_from_moments(sr, returns.size, m3 / m2**1.5, m4 / m2**2, benchmark_sr=0.02)
    assert probabilistic_sharpe_ratio(returns, benchmark_sr=0.02) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("returns", [[0.01, 0.02], [0.01, 0.01, 0.01, 0.01], []])
def test_psr_is_nan_for_short_or_flat_records(returns):
    assert math.isnan(probabilistic_sharpe_ratio(returns))


def test_expected_max_sharpe_reproduces_the_papers_sr_star():
    assert expected_max_sharpe(PAPER_TRIALS, PAPER_VARIANCE) == pytest.approx(0.1132, abs=5e-5)


def test_expected_max_sharpe_is_zero_for_one_trial_and_grows_with_trials_and_spread():
    assert expected_max_sharpe(1, 0.3) == 0.0
    assert expected_max_sharpe(10, 1.0) < expected_max_sharpe(100, 1.0) < expected_max_sharpe(1000, 1.0)
    assert expected_max_sharpe(100, 4.0) == pytest.approx(2 * expected_max_sharpe(100, 1.0))


def test_expected_max_sharpe_approximates_the_simulated_maximum_of_null_trials():
    rng = np.random.default_rng(0)
    simulated = rng.standard_normal((20_000, 100)).max(axis=1).mean()
    assert expected_max_sharpe(100, 1.0) == pytest.approx(simulated, rel=0.02)


@pytest.mark.parametrize("trials, variance", [(0, 1.0), (10, -0.1)])
def test_expected_max_sharpe_rejects_impossible_inputs(trials, variance):
    with pytest.raises(ValueError):
        expected_max_sharpe(trials, variance)


def test_dsr_reproduces_the_papers_worked_example():
    result = dsr_from_moments(PAPER_SR, PAPER_T, PAPER_SKEW, PAPER_KURTOSIS, PAPER_TRIALS, PAPER_VARIANCE)
    assert result["sr_star"] == pytest.approx(0.1132, abs=5e-5)
    assert result["dsr"] == pytest.approx(0.9004, abs=5e-5)
    # undeflated, the same record looks all but certain: the search is what costs it
    assert result["psr"] > 0.9999
    assert result["dsr"] < 0.95


def test_dsr_from_returns_falls_back_to_the_null_variance_and_says_so():
    rng = np.random.default_rng(3)
    returns = 0.08 + rng.standard_normal(500)
    result = deflated_sharpe_ratio(returns, trials=20)
    assert result["variance_from"] == "null"
    assert result["variance"] == pytest.approx(1 / 499)
    assert result["sr_star"] == pytest.approx(expected_max_sharpe(20, 1 / 499))
    assert result["dsr"] == pytest.approx(probabilistic_sharpe_ratio(returns, benchmark_sr=result["sr_star"]))
    assert result["psr"] == pytest.approx(probabilistic_sharpe_ratio(returns))
    assert result["n"] == 500 and result["trials"] == 20

    given = deflated_sharpe_ratio(returns, trials=20, trial_sr_variance=0.004)
    assert given["variance_from"] == "trials"
    assert given["sr_star"] == pytest.approx(expected_max_sharpe(20, 0.004))


def test_dsr_of_a_single_trial_is_its_psr_and_falls_as_trials_grow():
    rng = np.random.default_rng(4)
    returns = 0.1 + rng.standard_normal(300)
    one = deflated_sharpe_ratio(returns, trials=1)
    assert one["sr_star"] == 0.0
    assert one["dsr"] == pytest.approx(one["psr"])
    dsrs = [deflated_sharpe_ratio(returns, trials=n)["dsr"] for n in (1, 10, 100, 1000)]
    assert dsrs == sorted(dsrs, reverse=True)


def test_per_period_sharpe_is_mean_over_sample_std_and_zero_for_a_flat_column():
    pnl = np.array([[1.0, 0.0, 2.0], [3.0, 0.0, -1.0], [2.0, 0.0, 5.0]])
    expected = [pnl[:, 0].mean() / pnl[:, 0].std(ddof=1), 0.0, pnl[:, 2].mean() / pnl[:, 2].std(ddof=1)]
    assert per_period_sharpe(pnl) == pytest.approx(expected)


def test_pbo_reproduces_a_hand_worked_example():
    # 4 blocks of one row each, 3 trials, metric = mean P&L. The C(4, 2) = 6 in-sample halves:
    #   IS {0,1}: means (-1.5, 0.5, 0)  best trial 1; OOS {2,3} (0.5, 3, 1.5)  rank 3 → ω 3/4, λ  ln 3
    #   IS {0,2}: (0, 2, -1)            best 1;       OOS {1,3} (-1, 1.5, 2.5) rank 2 → ω 2/4, λ  0
    #   IS {0,3}: (0.5, 2, 1.5)         best 1;       OOS {1,2} (-1.5, 1.5, 0) rank 3 → λ  ln 3
    #   IS {1,2}: (-1.5, 1.5, 0)        best 1;       OOS {0,3} (0.5, 2, 1.5)  rank 3 → λ  ln 3
    #   IS {1,3}: (-1, 1.5, 2.5)        best 2;       OOS {0,2} (0, 2, -1)     rank 1 → ω 1/4, λ -ln 3
    #   IS {2,3}: (0.5, 3, 1.5)         best 1;       OOS {0,1} (-1.5, 0.5, 0) rank 3 → λ  ln 3
    # PBO = #(λ ≤ 0) / 6 = 2/6; the selected trial loses out of sample once (-1): 1/6.
    # Selected (IS, OOS) pairs: (0.5, 3), (2, 1.5), (2, 1.5), (1.5, 2), (2.5, -1), (3, 0.5):
    # Sxy = 9.5 - 6 · (23/12) · (5/4) = -39/8, Sxx = 25.75 - 6 · (23/12)² = 89/24,
    # slope = -117/89, intercept = 5/4 + (117/89)(23/12) = 671/178.
    performance = np.array([[0, 1, -1], [-3, 0, 1], [0, 3, -1], [1, 3, 4]], dtype=float)
    result = pbo_cscv(performance, blocks=4, metric=mean_metric)
    ln3 = math.log(3)
    assert result["logits"] == pytest.approx([ln3, 0.0, ln3, ln3, -ln3, ln3])
    assert result["pbo"] == pytest.approx(2 / 6)
    assert result["prob_oos_loss"] == pytest.approx(1 / 6)
    assert result["performance_degradation"]["slope"] == pytest.approx(-117 / 89)
    assert result["performance_degradation"]["intercept"] == pytest.approx(671 / 178)
    assert (result["combinations"], result["blocks"], result["trials"], result["sampled"]) == (6, 4, 3, False)


def test_pbo_of_pure_noise_is_near_one_half():
    # with no skill the in-sample winner's out-of-sample rank is uniform, so λ ≤ 0 half the time
    pbos = [pbo_cscv(np.random.default_rng(seed).standard_normal((480, 40)), blocks=8)["pbo"] for seed in range(10)]
    assert 0.35 <= float(np.mean(pbos)) <= 0.65


def test_pbo_of_a_real_edge_among_noise_is_near_zero():
    for seed in range(3):
        performance = np.random.default_rng(100 + seed).standard_normal((500, 20))
        performance[:, 7] += 0.25
        result = pbo_cscv(performance, blocks=10)
        assert result["pbo"] <= 0.1
        assert result["prob_oos_loss"] <= 0.1


def test_pbo_is_invariant_to_permuting_the_trials():
    rng = np.random.default_rng(11)
    performance = rng.standard_normal((240, 12))
    performance[:, 3] += 0.1
    shuffled = performance[:, rng.permutation(12)]
    original, permuted = pbo_cscv(performance, blocks=8), pbo_cscv(shuffled, blocks=8)
    assert permuted["pbo"] == original["pbo"]
    assert permuted["logits"] == pytest.approx(original["logits"], abs=1e-12)


def test_pbo_samples_halves_beyond_the_cap_reproducibly_and_says_so():
    performance = np.random.default_rng(5).standard_normal((161, 6))
    first = pbo_cscv(performance, blocks=16, max_combinations=50, seed=1)
    again = pbo_cscv(performance, blocks=16, max_combinations=50, seed=1)
    assert first["sampled"] is True
    assert (first["combinations"], first["total_combinations"]) == (50, math.comb(16, 8))
    assert again["logits"] == first["logits"]
    assert pbo_cscv(performance, blocks=4)["sampled"] is False


@pytest.mark.parametrize(
    "performance, blocks, message",
    [
        (np.zeros((10, 1)), 2, "at least 2 trials"),
        (np.zeros((3, 4)), 4, "at least as many periods"),
        (np.zeros((10, 4)), 3, "even integer"),
        (np.zeros((10, 4)), 0, "even integer"),
        (np.zeros(10), 2, "2-D"),
        (np.array([[0.0, np.nan], [1.0, 2.0]]), 2, "finite"),
    ],
)
def test_pbo_rejects_inputs_it_cannot_split(performance, blocks, message):
    with pytest.raises(ValueError, match=message):
        pbo_cscv(performance, blocks=blocks)
