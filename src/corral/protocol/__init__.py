"""The runner link's protocol, sans-I/O: wire messages and the two ends' state machines.

``messages`` owns the tagged union and its JSON codec, ``runner`` the runner's end
(``RunnerConnection``), ``server`` the coordinator's end of one socket (``ServerSession``).
Nothing here reads a clock, opens a socket or touches the store: the WebSocket endpoint and
the runner client are thin pumps that feed these classes frames and the time, and carry out
what they return (seed 000, DESIGN.md §3).
"""
