"""The tick core's two seams: a `Clock` (clock.py) and a `TickStore` (store.py), with Consul's
implementation (consul_store.py) and an in-memory model of Consul's measured semantics driven
by a virtual clock (memory.py). docs/tick-core.md says how to use them in tests."""
