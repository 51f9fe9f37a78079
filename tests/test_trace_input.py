"""Trace files: UTC timestamps whatever the machine's time zone, BOMs, binary files, fractional seconds."""

from __future__ import annotations

import csv
import gzip
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from servegym.workloads import TraceError, TraceWorkload, bundled_trace
from servegym.workloads import trace as trace_module

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def arrivals(path: Path) -> np.ndarray:
    return TraceWorkload(str(path)).sample(np.random.default_rng(0)).arrival_s


@pytest.fixture
def new_york():
    """The process in America/New_York for the test, restored afterwards."""
    if not hasattr(time, "tzset"):
        pytest.skip("time.tzset is POSIX only")
    before = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


# Ten fraction digits are more than datetime64[ns] holds, so that file takes the row-by-row path.
@pytest.mark.parametrize("fraction", ["", ".0000000000"], ids=["vectorised", "row-by-row"])
def test_a_gap_across_the_dst_change_stays_two_seconds(tmp_path, new_york, fraction):
    # 01:59:59 then 02:00:01 on 2023-11-05: in New York local time (clocks fall back at 02:00 EDT) that read
    # as 3,602 s; a trace carries no zone, so both are UTC and the gap is 2 s.
    assert time.localtime(datetime(2023, 11, 5, 5, 59, 59, tzinfo=UTC).timestamp()).tm_isdst == 1
    path = tmp_path / "dst.csv"
    path.write_text(f"{HEADER}2023-11-05 01:59:59{fraction},10,5\n2023-11-05 02:00:01{fraction},10,5\n")
    np.testing.assert_array_equal(arrivals(path), [0.0, 2.0])


def test_a_byte_order_mark_is_accepted(tmp_path):
    path = tmp_path / "bom.csv"
    path.write_text(f"{HEADER}2023-11-16 18:17:03,10,5\n2023-11-16 18:17:04.5,20,6\n", encoding="utf-8-sig")
    assert path.read_bytes().startswith(b"\xef\xbb\xbf")
    spec = TraceWorkload(str(path)).sample(np.random.default_rng(0))
    np.testing.assert_array_equal(spec.arrival_s, [0.0, 1.5])
    assert spec.num_prompt_tokens.tolist() == [10, 20]


def test_a_binary_file_is_rejected_naming_the_file(tmp_path):
    path = tmp_path / "trace.csv.gz"
    path.write_bytes(gzip.compress(f"{HEADER}2023-11-16 18:17:03,10,5\n".encode()))
    with pytest.raises(TraceError, match="line 1: binary data") as err:
        arrivals(path)
    assert str(path) in str(err.value)


def test_a_file_in_another_encoding_is_rejected_with_its_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes(f"{HEADER}2023-11-16 18:17:03,10,5\n".encode() + "caf\xe9,1,1\n".encode("latin-1"))
    with pytest.raises(TraceError, match=r"line 3: not UTF-8 text \(byte 0xe9\)") as err:
        arrivals(path)
    assert str(path) in str(err.value)


def test_fractional_seconds_of_any_length(tmp_path):
    path = tmp_path / "frac.csv"
    stamps = ["03", "03.25", "03.5", "04.123456789", "05.1234567890123", "06."]
    path.write_text(HEADER + "".join(f"2023-11-16 18:17:{s},10,5\n" for s in stamps))
    np.testing.assert_allclose(arrivals(path), [0.0, 0.25, 0.5, 1.123456789, 2.1234567890123, 3.0], atol=1e-6)


@pytest.mark.parametrize(("first", "second"), [("3000-01-01 00:00:00", "3000-01-01 00:00:02"),
                                               ("1500-06-01 12:00:00", "1500-06-01 12:00:02"),
                                               ("2023-1-5 1:2:3", "2023-1-5 1:2:5")])
def test_stamps_outside_the_vectorised_range_still_parse_exactly(tmp_path, first, second):
    # datetime64[ns] overflows silently past 2262: those years, like unpadded fields, take the row-by-row path.
    path = tmp_path / "far.csv"
    path.write_text(f"{HEADER}{first},10,5\n{second},10,5\n")
    np.testing.assert_array_equal(arrivals(path), [0.0, 2.0])
    fast = trace_module._parse_fast([[first, "10", "5"], [second, "10", "5"]])
    exact, _, _ = trace_module._parse_rows(str(path), path.read_text())
    assert fast is None or np.array_equal(fast[0], exact)  # absolute seconds, where an overflow would show


@pytest.mark.parametrize("stamp", ["now", "today", "2023-11-16", "2023-11-16T18:17:04", "NaT", "2023-11-16 18:17:04Z"])
def test_what_numpy_would_take_but_a_trace_must_not_hold_is_refused_with_its_line(tmp_path, stamp):
    path = tmp_path / "odd.csv"
    path.write_text(f"{HEADER}2023-11-16 18:17:03,10,5\n{stamp},10,5\n")
    with pytest.raises(TraceError, match="line 3"):
        arrivals(path)


def reference(path: Path) -> np.ndarray:
    """The old row-by-row parser's arithmetic, in UTC: whole seconds from strptime plus the fraction."""
    times = []
    with open(path, newline="") as handle:
        for row in list(csv.reader(handle))[1:]:
            whole, _, frac = row[0].strip().partition(".")
            stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
            times.append(stamp + (float("0." + frac) if frac else 0.0))
    return np.asarray(times) - times[0]


def test_the_bundled_trace_parses_to_the_old_parsers_arrivals_exactly():
    path = bundled_trace()
    trace_module._read.cache_clear()
    fast = arrivals(path)
    assert len(fast) == 8819
    np.testing.assert_array_equal(fast, reference(path))
    slow, _, _ = trace_module._parse_rows(str(path), path.read_text())
    np.testing.assert_array_equal(slow - slow[0], fast)
