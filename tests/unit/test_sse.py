"""frameserve._sse: what the encoder writes, the reader gets back (any chunking, any line
ending the standard allows), and ``Last-Event-ID`` accepts exactly the ids a store can hold."""

from __future__ import annotations

import pytest

from frameserve._sse import MAX_EVENT_ID_CHARS, EventReader, comment, encode, parse_last_event_id, retry_field


def _read(stream: bytes, step: int) -> tuple[list[tuple[str, str, str]], EventReader]:
    reader = EventReader()
    got = []
    for i in range(0, len(stream), step):
        got.extend((e.event, e.data, e.id) for e in reader.feed(stream[i : i + step]))
    return got, reader


@pytest.mark.parametrize("step", [1, 2, 7, 10_000])
def test_events_comments_and_retry_read_back_whatever_the_chunking(step: int) -> None:
    stream = (
        retry_field(1000)
        + encode({"a": 1, "b": "é"}, event="claimed", id=3)
        + comment("keep-alive")
        + encode("two\nlines", event="phase", id=4)
        + encode("no type")
    )
    got, reader = _read(stream, step)
    assert got == [("claimed", '{"a":1,"b":"é"}', "3"), ("phase", "two\nlines", "4"), ("message", "no type", "4")]
    assert reader.retry_ms == 1000 and reader.comments == 1 and reader.last_event_id == "4"


@pytest.mark.parametrize("ending", [b"\r\n", b"\r", b"\n"])
def test_every_line_ending_of_the_standard_splits_lines(ending: bytes) -> None:
    stream = ending.join([b"\xef\xbb\xbfevent: x", b"id: 9", b"data: 1", b"data: 2", b"", b""])
    for step in (1, 3, len(stream)):
        got, _ = _read(stream, step)
        assert got == [("x", "1\n2", "9")], (ending, step)


def test_an_event_without_data_is_not_dispatched_but_its_id_counts() -> None:
    got, reader = _read(b"event: x\nid: 5\n\n", 100)
    assert got == [] and reader.last_event_id == "5"


def test_a_line_over_the_limit_is_refused_not_buffered() -> None:
    reader = EventReader(max_line_bytes=64)
    with pytest.raises(ValueError, match="longer than 64 bytes"):
        reader.feed(b"data: " + b"x" * 100)


@pytest.mark.parametrize("kwargs", [{"event": "a\nb"}, {"id": "1\r"}, {"id": "a\0"}, {"retry_ms": -1}])
def test_the_encoder_refuses_what_would_break_the_framing(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        encode("x", **kwargs)  # type: ignore[arg-type]


def test_last_event_id_accepts_the_ids_a_store_can_hold() -> None:
    assert parse_last_event_id(None) is None and parse_last_event_id("") is None and parse_last_event_id(" ") is None
    assert parse_last_event_id("0") == 0 and parse_last_event_id(" 42 ") == 42
    biggest = "9" * MAX_EVENT_ID_CHARS
    assert int(biggest) < 2**63 and parse_last_event_id(biggest) == int(biggest)


@pytest.mark.parametrize(
    "bad", ["null", "-1", "1.5", "x1", "١٢", "9" * (MAX_EVENT_ID_CHARS + 1), "9570736819646601027101"]
)
def test_last_event_id_refuses_anything_else_saying_what_is_accepted(bad: str) -> None:
    with pytest.raises(ValueError, match="decimal number, at most 18 digits"):
        parse_last_event_id(bad)
