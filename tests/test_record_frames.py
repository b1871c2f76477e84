"""Record frames (a get_logger record as a plain tuple, the hot path of a log flood) are declared once in the
schema: the writer's frames pass the kernel's check, and a frame with any field of another type is refused."""

import marshal
import os

import pytest

from notebook_launcher.schema.decoding import CorruptFrame, FrameDecoder, check_header
from notebook_launcher.schema.events import (
    RECORD_FRAME_FIELDS,
    RECORD_FRAME_TYPES,
    RECORD_MESSAGE,
    EventWriter,
)
from notebook_launcher.schema.lines import record_event

VALUES = ("INFO", 20, "train", "step 3", "train.py", 31, "train", 1700000000.5)  # RECORD_KEYS but worker_seq


def written_frame() -> tuple:
    read_end, write_end = os.pipe()
    try:
        EventWriter(write_end, rank=1).emit_record(VALUES)
        (header, _), = FrameDecoder().feed(os.read(read_end, 65536))
        return header
    finally:
        os.close(read_end)
        os.close(write_end)


def test_the_writers_record_frame_is_what_the_schema_declares():
    frame = written_frame()
    check_header(frame, 0)
    assert len(frame) == len(RECORD_FRAME_FIELDS) and tuple(map(type, frame)) == RECORD_FRAME_TYPES
    assert frame[RECORD_MESSAGE] == "step 3"
    event = record_event(1, 5, frame)
    assert event.data["message"] == "step 3" and event.data["line"] == 31 and event.data["worker_seq"] == 1


@pytest.mark.parametrize("field", range(1, len(RECORD_FRAME_FIELDS)))
def test_a_record_frame_with_one_field_of_another_type_is_refused(field):
    frame = list(written_frame())
    frame[field] = b"x" if isinstance(frame[field], str) else "x"
    with pytest.raises(CorruptFrame, match="record frame"):
        check_header(tuple(frame), 0)


def test_a_record_frame_with_an_int_past_64_bits_or_a_field_more_is_refused():
    frame = written_frame()
    with pytest.raises(CorruptFrame):
        check_header((*frame[:3], 1 << 63, *frame[4:]), 0)
    with pytest.raises(CorruptFrame):
        check_header((*frame, 0), 0)
    assert marshal.loads(marshal.dumps(frame)) == frame
