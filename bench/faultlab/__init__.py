"""The fault lab: a namespace cluster, its fault scenarios, the guarded resource (oracle) and the
test job, shared by tests/faults (each scenario once) and bench/faults.py (the soak).

Here rather than under tests/ so that the bench imports nothing from the tests, and not under
provision/ since it is no part of the product. Importable from the repository root, which the
editable install puts on sys.path (bench/faults.py also puts it there itself).
"""
