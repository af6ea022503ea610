"""The formatters, on hand-written cases: three significant digits, unit steps at the rounding boundary."""

import math

import pytest

from poolsim.reports import units


@pytest.mark.parametrize("value, text", [
    (0, "0"), (7, "7"), (950, "950"), (999, "999"), (999.4, "999"), (999.6, "1.00k"), (1000, "1.00k"),
    (1234, "1.23k"), (12_345, "12.3k"), (123_456, "123k"), (999_499, "999k"), (999_600, "1.00M"),
    (1_234_567, "1.23M"), (2_500_000_000, "2.50B"), (0.5, "0.500"), (None, "–"), (math.nan, "–"),
])
def test_tokens(value, text):
    assert units.tokens(value) == text


@pytest.mark.parametrize("value, text", [
    (0, "0 B"), (512, "512 B"), (1023, "1,023 B"), (1024, "1.00 KiB"), (36_864, "36.0 KiB"),
    (1_048_000, "1,023 KiB"), (1_048_576, "1.00 MiB"), (3 * 2**29, "1.50 GiB"), (4.5 * 2**30, "4.50 GiB"),
    (141 * 2**30, "141 GiB"), (3 * 2**40, "3.00 TiB"), (None, "–"),
])
def test_nbytes(value, text):
    assert units.nbytes(value) == text


@pytest.mark.parametrize("value, text", [
    (0, "0 s"), (5e-7, "0.500 µs"), (8.5e-4, "850 µs"), (0.0123, "12.3 ms"), (0.12345, "123 ms"),
    (0.9996, "1.00 s"), (1.234, "1.23 s"), (12.34, "12.3 s"), (99.96, "100 s"), (3725.2, "3,725 s"),
    (None, "–"), (math.nan, "–"),
])
def test_seconds(value, text):
    assert units.seconds(value) == text


@pytest.mark.parametrize("value, text", [
    (0, "0.0%"), (0.1234, "12.3%"), (0.0005, "0.1%"), (1, "100.0%"), (0.5449, "54.5%"), (None, "–"),
    (0.0004, "<0.1%"), (0.9996, ">99.9%"), (0.9994, "99.9%"),
])
def test_percent(value, text):
    assert units.percent(value) == text


@pytest.mark.parametrize("value, text", [
    (9.996, "10.0"), (0.012345, "0.0123"), (99.96, "100"), (-1.234, "-1.23"), (123.4, "123"), (999.5, "1,000"),
])
def test_sig3(value, text):
    assert units.sig3(value) == text


@pytest.mark.parametrize("value, unit, text", [
    (1_400, "tokens", "1.40k"), (36_864, "bytes", "36.0 KiB"), (0.0217, "s", "21.7 ms"), (0.45, "fraction", "45.0%"),
    (4089, "count", "4,089"), (1.0916, "count", "1.09"), (20.0, "count", "20"), (734.2, "tok/s", "734 tok/s"), (0.7341, "req/s", "0.734 req/s"),
    (0.0406, "GiB", "0.0406 GiB"), (2.0, "GiB", "2 GiB"), ("kv", "text", "kv"), (True, "text", "yes"),
    (None, "s", "–"), (None, "GiB", "–"),
])
def test_by_unit(value, unit, text):
    assert units.by_unit(value, unit) == text


def test_run_values_named_in_gib_carry_the_unit():
    """The memory plan's GiB figures all read as GiB, weights_gib_per_rank included (it printed a bare 91.6)."""
    from poolsim.reports.tables import run_value
    assert run_value("memory_plan.weights_gib_per_rank", 91.56) == "91.6 GiB"
    assert run_value("memory_plan.rest_gib", 34.68) == "34.7 GiB"
