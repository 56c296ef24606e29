"""The tick core: a tick owned from plan to record (core.py; one claimed tick under its lock:
held.py; the session pool: pool.py; what runs under the lock: edge.py), over two seams, a
`Clock` (clock.py) and a `TickStore` (store.py), with Consul's implementation
(consul_store.py) and an in-memory model of Consul's measured semantics driven by a virtual
clock (memory.py). bench/simulate.py drives the core with the model; docs/tick-core.md says how
to use the seams in tests. `lockctl run`, `schedule` and `provision.embed` still run on
provision/runner and provision/scheduler until they move onto this core."""
