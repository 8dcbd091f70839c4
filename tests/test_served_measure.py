"""The measure an endless stream's users saw, and the longest wait between models."""

from __future__ import annotations

import math

import pytest

from alma_daemon.observability.served_measure import longest_wait, served_measure


def rows(values, trained=()):
    return [{"prequential_error": v, "trained": i in trained} for i, v in enumerate(values)]


def test_the_served_measure_is_the_mean_over_the_streams_second_half():
    assert served_measure(rows([0.9, 0.9, 0.2, 0.4]), "error") == pytest.approx(0.3)
    # An odd count judges the longer half: the middle chunk counts.
    assert served_measure(rows([0.9, 0.5, 0.1]), "error") == pytest.approx(0.3)
    assert served_measure(rows([0.9, 0.5, 0.1, 0.3]), "error", share=0.25) == pytest.approx(0.3)


def test_non_finite_values_are_left_out_and_nothing_finite_gives_none():
    assert served_measure(rows([0.5, math.nan, 0.2]), "error") == pytest.approx(0.2)
    assert served_measure(rows([math.nan, math.nan]), "error") is None
    assert served_measure([], "error") is None
    assert served_measure(rows([0.1, 0.2]), "recall") is None


def test_the_longest_wait_counts_chunks_between_trained_steps():
    assert longest_wait(rows([0] * 10, trained={0, 3, 9})) == 5
    assert longest_wait(rows([0] * 4)) == 4
    assert longest_wait([]) == 0


def test_the_longest_wait_counts_a_stage_between_chunks_where_rows_record_the_models_age():
    # A stage between chunks (a schedule, the bound in seconds) has no row: its flags say nothing,
    # the model's age after the next chunk does.
    rows = [{"trained": False, "model_age_chunks": age} for age in (1, 2, 1, 2, 3)]
    assert longest_wait(rows) == 3
    assert longest_wait([{"trained": False}] * 5) == 5
