"""The output pump (runner/pump.py): one thread copies every job's pipes, whole and in order,
closes each read end at its end of file, and a forked child gets a pump of its own."""

from __future__ import annotations

import os
import threading

from provision.runner.output import OutputTee
from provision.runner.pump import OutputPump, output_pump


class Collected:
    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()
        self.chunks: list[bytes] = []
        self.done = threading.Event()

    def received(self, chunk: bytes) -> None:
        self.chunks.append(chunk)

    def ended(self) -> None:
        self.done.set()


def test_many_streams_each_whole_and_in_order_on_one_thread() -> None:
    pump = OutputPump()
    streams = [Collected() for _ in range(120)]
    before = threading.active_count()
    for stream in streams:
        pump.add(stream)
    assert threading.active_count() == before + 1  # one thread for all of them
    for round_ in range(3):
        for n, stream in enumerate(streams):
            os.write(stream.write_end, f"{n}:{round_};".encode())
    for stream in streams:
        os.close(stream.write_end)
    for n, stream in enumerate(streams):
        assert stream.done.wait(10)
        assert b"".join(stream.chunks) == f"{n}:0;{n}:1;{n}:2;".encode()
        try:
            os.fstat(stream.read_end)
        except OSError:
            pass
        else:
            raise AssertionError("the pump left a read end open after its end of file")


def test_a_stream_added_while_others_are_open_is_served_at_once() -> None:
    pump = OutputPump()
    quiet = Collected()
    pump.add(quiet)  # never ends: the pump waits in select
    late = Collected()
    pump.add(late)
    os.write(late.write_end, b"hello")
    os.close(late.write_end)
    assert late.done.wait(10)
    assert b"".join(late.chunks) == b"hello"
    os.close(quiet.write_end)
    assert quiet.done.wait(10)


def test_a_forked_child_has_a_pump_of_its_own() -> None:
    parent_pump = output_pump()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its pump is not the parent's, whose thread it does not have
        ok = output_pump() is not parent_pump
        tee = OutputTee()
        tee.start()  # its first stream starts the child's own pump
        tee.close()
        os.write(write_end, b"1" if ok else b"0")
        os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    assert os.waitstatus_to_exitcode(status) == 0
    os.close(read_end)


def test_the_tee_keeps_the_tails_of_both_streams() -> None:
    tee = OutputTee()
    out, err = tee.child_fds
    # the job's ends: what a forked job would hold (dup'd, as the tee closes its own at start)
    job_out, job_err = os.dup(out), os.dup(err)
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in tee.streams:
        stream.target = devnull  # not the test's own stdout
    tee.start()
    os.write(job_out, b"out line\n")
    os.write(job_err, b"err line\n")
    os.close(job_out)
    os.close(job_err)
    assert tee.tails([]) == ("out line\n", "err line\n")
    tee.close()
    os.close(devnull)
