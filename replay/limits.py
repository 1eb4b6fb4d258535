"""How big the input may make a replay: every size a trace or flag controls, bounded.

The replay allocates per request and per second of trace time (the oracle's per-second
work is one float a second). Without bounds a two-row trace dated 2000 and 2100 asked
for 23.5 GiB, and ``--rate-multiplier 1e9`` for 298 GiB, before the kernel killed the
process. The readers (``replay.trace``) and the flags (``unitscale.flags``) check these
before anything they size is allocated, and the error names the row or flag and the
limit. Plain constants, no numpy: the command line reads them on every start.
"""

from __future__ import annotations

MAX_TRACE_SPAN_SECONDS = 31 * 86_400
"""Trace time from the first to the last request, as read and after time compression.

A month holds the longest public traces (ServeGen's two weeks, Azure's week) and costs
21 MB a per-second array; a span beyond it is a bad timestamp far more often than a
real trace, and one of 100 years cost 23.5 GiB.
"""
MAX_POD_LIST_SECONDS = 366 * 86_400
"""A pod list's times (``creation_time``, ``deletion_time``, ``scheduled_time``): Alibaba's
openb list spans 149 days; a time beyond a year is a bad row, and one such row set the
end that every other task's arrival is compressed against."""
MAX_TRACE_REQUESTS = 10_000_000
"""Requests a replay holds, as read and after the rate multiplier.

Ten times the largest benchmark run (the Azure conversation trace x50, about a
million); the simulator keeps about 400 bytes a request across its arrays and every
policy's results, so this is about 4 GB.
"""
MAX_RATE_MULTIPLIER = 1_000.0
"""``--rate-multiplier``: each request is copied into the second after it this many
times, so far above this the trace's per-second shape is gone anyway (the benchmarks use
up to 50)."""
MAX_TIME_COMPRESSION = 1_000_000.0
"""``--time-compression``: an hour in 3.6 ms; beyond it every arrival is one instant."""
MAX_TOKENS = 10_000_000
"""Prompt or output tokens of one request: the largest context window of any model
served today (the public traces peak at 191,378). Above it is a bad row, and above
int64 did not fit the trace's arrays at all."""
MAX_LINE_BYTES = 1 << 20
"""One line of a trace file. A Mooncake line with its ``hash_ids`` is under 3 KB at the
largest prompt in the public trace; a longer line is not a request."""
MAX_REPLICAS = 10_000
"""``--max-replicas``: the simulator sizes per-replica arrays (histograms, counters) by
it up front, about 1.2 KB each; 10,000 is far beyond one deployment's fleet."""
