"""The scheduler: the only code of delivery that knows groups, batching and calls in flight.

A sink's limits (`sinks/base.py` `Limits`: `batch_size`, `max_in_flight`, `ordered`) are resolved against its
config once (limits.py). A staged block is cut into calls settled on their own (calls.py); each call holds back
what its group's earlier failure or parked message keeps behind (order.py), goes to the sink in the calls its
ordering needs (dispatch.py: at most one message per group per call for a sink whose calls are not `ordered`),
a request sink's cut into requests of its `batch_size` with up to its `max_in_flight` out on its event loop
(requests.py); up to `max_in_flight` calls are out at once across blocks, a group's next message never before
its previous one's outcome (window.py); calls are settled in log order and the offset moves over the settled
prefix (settle.py). A sink only sends a call and reports each message's outcome.
"""
