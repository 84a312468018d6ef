"""The advice record's placebo battery (experiments/record_placebo.py, agents.advice.record): advice without
information binds on at most 5% of placebos over a default-length run, informed advice binds within its first tenth.
The short form runs in the default suite; the long form (200 placebos of each kind, 20 market paths) is `slow`:
    .venv/bin/python -m pytest -m slow tests/test_record_evidence.py
"""

from __future__ import annotations

import pytest

from experiments.record_placebo import battery


def check(out: dict) -> None:
    for name, rates in out["placebo"].items():
        # a default-length run (190 looks) that answers the keys in a random order, as training does
        assert rates["fill_bound"] <= 0.05, (name, rates)
        # the keys revealed in time order, a look after every call: thousands of looks, the same bar
        assert rates["walk_bound"] <= 0.10, (name, rates)
    assert out["informed"]["bound_within_tenth"] >= 0.95, out["informed"]
    # sessions are independent clusters where calls are not: a placebo's t over calls spreads far wider than 1
    spread = out["cluster_t_spread"]["rules shifted"]
    assert spread["call"] > 1.5 and spread["session"] < 1.3


def test_the_record_binds_to_placebos_rarely_and_to_informed_advice_early():
    check(battery(seeds=[0, 1, 2], placebos=40))


@pytest.mark.slow
def test_the_record_placebo_battery_long_form():
    check(battery(seeds=list(range(20)), placebos=200))
