"""The scheduler: the only code of delivery that knows groups.

A staged block is cut into the sink's calls (calls.py); each call holds back what its group's earlier failure
or parked message keeps behind (order.py), goes to the sink in the calls its ordering needs (dispatch.py),
with up to the sink's `max_in_flight` calls out at once across blocks, a group's next message never before its
previous one's outcome (window.py); calls are settled in log order and the offset moves over the settled
prefix (settle.py). A sink declares its limits (`sinks/base.py` `Limits`) and reports each message's outcome.
"""
