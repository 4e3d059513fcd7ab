"""The Postgres sink's staging block (sinks/pg_copy.py) read back by a real PostgreSQL COPY: every
character that COPY text treats specially arrives as it was sent."""

from __future__ import annotations

import json

from cdc_pipeline.sinks.base import OutboundMessage
from cdc_pipeline.sinks.pg_copy import stage_block


def test_stage_block_round_trips_through_copy(source_db):
    records = [
        {"t": "tab\there, newline\nthere, cr\rback\\slash", "nul": "a\\u0000b", "u": "hé ☃ 𝄞"},
        {"quote": '"q"', "end": "\\.", "arr": [1, None, "x\ty"]},
        {"empty": ""},
    ]
    payloads = [json.dumps({"record": r}, ensure_ascii=False).encode() for r in records]
    # raw whitespace between tokens too: a payload is bytes, whatever produced it
    payloads.append(b'{"record":\t{"raw": "a"}}\r\n')
    messages = [
        OutboundMessage("10:0", None, None, payloads[0]),
        OutboundMessage("10:1", "public|t|[1]", "s.t\twith\ttabs", payloads[1]),
        OutboundMessage("11:0", "g\\1\nx", None, payloads[2]),
        OutboundMessage("9:5", "", "", payloads[3]),
    ]
    block, last = stage_block(messages)
    assert last == (11, 0)
    with source_db.connect() as conn:
        conn.execute("CREATE TEMP TABLE st (seq integer, lsn bigint, idx integer, grp text, route text, msg text)")
        with conn.cursor().copy("COPY st (seq, lsn, idx, grp, route, msg) FROM STDIN") as copy:
            copy.write(block)
        rows = conn.execute("SELECT seq, lsn, idx, grp, route, msg FROM st ORDER BY seq").fetchall()
        assert conn.execute("SELECT count(*) FROM st WHERE msg::jsonb IS NOT NULL").fetchone() == (4,)
    assert rows == [
        (i, int(m.key.split(":")[0]), int(m.key.split(":")[1]), m.group, m.route, m.payload.decode())
        for i, m in enumerate(messages)
    ]
