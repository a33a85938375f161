import pytest

from connectors.outbox.recipients import (
    InvalidRecipient,
    conversation_key_for,
    mask_recipient,
    normalize_recipient,
)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("+55 (11) 98765-4321", "5511987654321"),
        ("5511987654321", "5511987654321"),
        ("1.415.555.2671", "14155552671"),
        ("5511987654321@s.whatsapp.net", "5511987654321@s.whatsapp.net"),
        ("5511987654321@C.US", "5511987654321@c.us"),
        ("120363025246125888@g.us", "120363025246125888@g.us"),
        ("5511987654321-1600000000@g.us", "5511987654321-1600000000@g.us"),
    ],
)
def test_normalizes(raw: str, expected: str) -> None:
    assert normalize_recipient(raw) == expected


@pytest.mark.parametrize(
    "raw", ["", "   ", None, 42, "12345", "+0 11 98765 4321", "abc", "55119@x.com", "1" * 16]
)
def test_rejects(raw: object) -> None:
    with pytest.raises(InvalidRecipient):
        normalize_recipient(raw)


def test_conversation_key_is_digits_for_people_and_jid_for_groups() -> None:
    assert conversation_key_for("5511987654321@s.whatsapp.net") == "5511987654321"
    assert conversation_key_for("5511987654321") == "5511987654321"
    assert conversation_key_for("120363@g.us") == "120363@g.us"


def test_mask_never_shows_the_whole_number() -> None:
    masked = mask_recipient("5511987654321")
    assert masked != "5511987654321"
    assert "98765" not in masked
    assert mask_recipient("5511987654321@s.whatsapp.net").endswith("@s.whatsapp.net")


@pytest.mark.parametrize(
    "raw",
    [
        "５５１１９８７６５４３２１",  # fullwidth digits
        "٥٥١١٩٨٧٦٥٤٣٢١",  # Arabic-Indic digits
        "5511９８７６５４３２１@s.whatsapp.net",
        "１２０３６３@g.us",
    ],
)
def test_only_ascii_digits_make_a_recipient(raw: str) -> None:
    # str.isdigit() and re's \d accept them, the gateways and the SQL trigger's
    # conversation key do not: a different conversation, or a send that fails late.
    with pytest.raises(InvalidRecipient):
        normalize_recipient(raw)


@pytest.mark.parametrize("number", ["14155552671", "1415555267", "5511987654321", "551198765"])
def test_a_masked_number_hides_at_least_six_digits(number: str) -> None:
    masked = mask_recipient(number)
    assert masked.count("*") >= 6 - (len(number) < 10) and len(masked) == len(number)
    shown = [c for c in masked if c != "*"]
    assert len(shown) <= 6, masked
