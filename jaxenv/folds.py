"""Splits over whole sessions: the walk-forward's folds, and a run's splits named by sessions (`data.splits`).

A fold trains on a window of sessions, chooses its checkpoint on the window's last sessions (its validation window,
cut from the training window, never from the test window), leaves a purge gap of sessions untouched, then is tested on
the next sessions. The folds' test windows lie back to back at the data's end (or `step` sessions apart), so every
session is in at most one test window and the test windows together are one out-of-sample path:

    anchored (train_sessions = 0):   [train .......... | val ] purge [test 0]
                                     [train ................ | val ] purge [test 1]
    sliding (train_sessions = L):          [train .... | val ] purge [test 1]

A run trains on a fold through `data.splits` ("train=0:60,val=60:72,test=74:86": session ranges [a, b), numbered from
0 in time order); the bars between its splits (the purge) are in none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPLIT_NAMES = ("train", "val", "test")
MIN_TRAIN_SESSIONS = 2  # a fold trains on at least this many sessions besides its validation window


@dataclass(frozen=True)
class FoldPlan:
    folds: int  # K: test windows
    test_sessions: int  # M: sessions in a test window
    val_sessions: int  # the validation window, cut from the end of the training window
    purge: int = 1  # G: sessions between the training window's end (its validation window included) and the test's
    train_sessions: int = 0  # a sliding window of this many sessions (validation included); 0: anchored at the start
    step: int = 0  # sessions between the starts of consecutive test windows; 0: M (back to back)


@dataclass(frozen=True)
class Fold:
    index: int
    train: tuple[int, int]  # sessions [a, b)
    val: tuple[int, int]
    test: tuple[int, int]

    def splits(self) -> dict[str, tuple[int, int]]:
        return {"train": self.train, "val": self.val, "test": self.test}

    def spec(self) -> str:
        """The fold as `data.splits`."""
        return ",".join(f"{name}={a}:{b}" for name, (a, b) in self.splits().items())


def plan_folds(sessions: int, plan: FoldPlan) -> list[Fold]:
    """The folds of `plan` over `sessions` sessions; a ValueError names the setting that does not fit, in one line."""
    k, m, v, g = plan.folds, plan.test_sessions, plan.val_sessions, plan.purge
    step = plan.step or m
    for value, flag, least in ((k, "--folds", 1), (m, "--test-sessions", 1), (v, "--val-sessions", 1),
                               (g, "--purge", 0), (plan.train_sessions, "--train-sessions", 0)):
        if value < least:
            raise ValueError(f"{flag} {value}: must be at least {least}")
    if step < m:
        raise ValueError(f"--step {step} is shorter than --test-sessions {m}: test windows would overlap (a session "
                         "may be in one test window at most)")
    first_test = sessions - m - (k - 1) * step
    first_train_end = first_test - g  # where fold 0's training window (its validation included) ends
    if first_train_end - v < MIN_TRAIN_SESSIONS:
        need = MIN_TRAIN_SESSIONS + v + g + m + (k - 1) * step
        raise ValueError(f"{sessions} sessions hold {k} folds of {m} test sessions (step {step}) after a purge of {g} "
                         f"and {v} validation sessions only with at least {need}: use fewer folds or shorter windows")
    if plan.train_sessions and plan.train_sessions - v < MIN_TRAIN_SESSIONS:
        raise ValueError(f"--train-sessions {plan.train_sessions} leaves fewer than {MIN_TRAIN_SESSIONS} training "
                         f"sessions beside --val-sessions {v}")
    if plan.train_sessions > first_train_end:
        raise ValueError(f"--train-sessions {plan.train_sessions}: fold 0 has only {first_train_end} sessions before "
                         f"its purge of {g}; use a shorter window, fewer folds or --train-sessions 0 (anchored)")
    folds = []
    for i in range(k):
        test = first_test + i * step
        end = test - g
        start = end - plan.train_sessions if plan.train_sessions else 0
        folds.append(Fold(i, (start, end - v), (end - v, end), (test, test + m)))
    return folds


def session_starts(session_id: np.ndarray) -> np.ndarray:
    """[S + 1] the first bar of each session in time order, then the bar count."""
    starts = np.flatnonzero(np.diff(np.asarray(session_id), prepend=np.nan))
    return np.r_[starts, len(session_id)]


def parse_splits(text: str) -> dict[str, tuple[int, int]]:
    """`data.splits` ("train=0:60,val=60:72,test=74:86") as session ranges; a ValueError names what is wrong."""
    out: dict[str, tuple[int, int]] = {}
    for part in text.split(","):
        name, _, bounds = part.strip().partition("=")
        a, sep, b = bounds.partition(":")
        if name not in SPLIT_NAMES or not sep or not a.strip().isdigit() or not b.strip().isdigit():
            raise ValueError(f"data.splits: {part.strip()!r} is not NAME=A:B (NAME one of {', '.join(SPLIT_NAMES)}; "
                             "sessions [A, B), counted from 0)")
        out[name] = (int(a), int(b))
    missing = [n for n in SPLIT_NAMES if n not in out]
    if missing:
        raise ValueError(f"data.splits: {', '.join(missing)} missing; give train, val and test")
    bounds = [out[n] for n in SPLIT_NAMES]
    if any(a >= b for a, b in bounds) or any(bounds[i][1] > bounds[i + 1][0] for i in range(2)):
        raise ValueError(f"data.splits {text!r}: each range must be non-empty and train, val, test in time order "
                         "without overlap")
    return out


def session_splits(session_id: np.ndarray, text: str) -> dict[str, tuple[int, int]]:
    """`data.splits` as bar ranges of a market with these sessions; a ValueError when a range passes its end."""
    starts = session_starts(session_id)
    sessions = len(starts) - 1
    spans = parse_splits(text)
    last = max(b for _, b in spans.values())
    if last > sessions:
        raise ValueError(f"data.splits {text!r}: the data holds {sessions} sessions, the splits reach session {last}")
    return {name: (int(starts[a]), int(starts[b])) for name, (a, b) in spans.items()}
