"""Tests for the Lsn value type."""

from __future__ import annotations

import dataclasses

import pytest

from connectors.cdc.lsn import ZERO_LSN, Lsn


def test_parse_and_format_round_trip() -> None:
    lsn = Lsn.parse("16/B374D848")
    assert int(lsn) == 0x16_B374D848
    assert str(lsn) == "16/B374D848"
    assert repr(lsn) == "Lsn('16/B374D848')"


def test_parse_accepts_lower_case_and_formats_upper_case_without_padding() -> None:
    assert str(Lsn.parse("0/1a")) == "0/1A"
    assert str(Lsn(0)) == "0/0"
    assert str(Lsn(2**64 - 1)) == "FFFFFFFF/FFFFFFFF"
    assert Lsn.parse("FFFFFFFF/FFFFFFFF") == Lsn(2**64 - 1)


def test_zero_constants() -> None:
    assert Lsn.ZERO == Lsn(0) == ZERO_LSN
    assert str(Lsn.ZERO) == "0/0"


def test_ordering_is_numeric_not_lexical() -> None:
    # As strings "9/0" > "10/0"; as positions it is the other way round.
    assert Lsn.parse("9/0") < Lsn.parse("10/0")
    assert Lsn.parse("0/FFFFFFFF") < Lsn.parse("1/0")
    assert max(Lsn.parse("A/0"), Lsn.parse("9/FFFFFFFF")) == Lsn.parse("A/0")
    assert sorted([Lsn(3), Lsn(1), Lsn(2)]) == [Lsn(1), Lsn(2), Lsn(3)]


def test_equal_values_hash_equal_and_instances_are_immutable() -> None:
    assert hash(Lsn.parse("0/10")) == hash(Lsn(16))
    assert {Lsn(16), Lsn.parse("0/10")} == {Lsn(16)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        Lsn(1).value = 2  # type: ignore[misc]


def test_arithmetic_with_ints() -> None:
    assert Lsn.parse("0/FFFFFFFF") + 1 == Lsn.parse("1/0")
    assert Lsn.parse("1/0") - 1 == Lsn.parse("0/FFFFFFFF")
    assert Lsn.parse("1/10") - Lsn.parse("1/0") == 16
    with pytest.raises(ValueError):
        Lsn(0) - 1
    with pytest.raises(ValueError):
        Lsn(2**64 - 1) + 1
    with pytest.raises(TypeError):
        Lsn(1) + Lsn(2)  # type: ignore[operator]


@pytest.mark.parametrize("value", [-1, 2**64, -(2**70)])
def test_rejects_out_of_range_values(value: int) -> None:
    with pytest.raises(ValueError, match="out of range"):
        Lsn(value)


@pytest.mark.parametrize("value", ["1/0", 1.0, True])
def test_rejects_non_int_values(value: object) -> None:
    with pytest.raises(TypeError):
        Lsn(value)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text",
    [
        "",
        "16",
        "16/",
        "/16",
        "16//0",
        "0x16/0",
        "-1/0",
        "+1/0",
        " 1/0",
        "1/0 ",
        "123456789/0",
        "0/123456789",
        "G/0",
        "1/0/0",
    ],
)
def test_parse_rejects_malformed_text(text: str) -> None:
    with pytest.raises(ValueError, match="malformed LSN"):
        Lsn.parse(text)
