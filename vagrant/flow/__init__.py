"""The Vagrant flow's orchestration (`scripts/vagrant-verify`, `make vagrant-verify`), in Python.

    settings.py   what the run is: sizes, paths, names of this run, the environment it exports
    teardown.py   the one undo stack (unwound in reverse on success, failure, SIGTERM, Ctrl-C)
    phases.py     the phase timer (phases.txt, the report's phase table)
    artifacts.py  what the run keeps: report, summary.json, the end-of-run secret check
    commands.py   child processes (each waited for by its Popen), logs, the run's namespace
    libvirt.py    the namespace, libvirtd and virtlogd, the storage pool, and their undoing
    steps.py      the flow's phases, in order
    main.py       the entry point: preflight, flow, teardown, report

A tool of the repository, not part of the shipped `provision` package (which it imports).
Run as `PYTHONPATH=vagrant .venv/bin/python -m flow` (what scripts/vagrant-verify does).
"""
