"""The Locker: an app's scheduled functions behind lockctl's tick core, once per tick across
every replica that calls them (the claim, the ledger, the fencing rules and the events of
`lockctl run`): a call's turn at its tick on the Locker's one core (embed/called.py), serve()'s
ticks on a core of its own (embed/served.py)."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, TextIO

from provision.consul import AgentClock, Consul, ConsulError, resolve_settings
from provision.embed.bodies import BlockBody, Body, ProcessBody, ThreadBody
from provision.embed.called import CallCore, CallSetting, call_turn, outcome_of, refusal_fields
from provision.embed.run import (
    Isolation,
    LoggerStream,
    OnLost,
    Run,
    RunEvents,
    RunOutcome,
)
from provision.embed.served import AppJob, AppJobs, serve_on_core
from provision.errors import InputError
from provision.keyed import key_problem
from provision.ledger.health import JobHealth, assess
from provision.ledger.history import JobHistory, LedgerJob, Wanted, read_history
from provision.ledger.records import tick_name
from provision.ledger.store import Ledger
from provision.notify.notifier import JobNotify
from provision.outcomes import Outcome
from provision.runner.precheck import utc_now
from provision.runner.results import RunResult, SkipReason
from provision.runner.stop import StopRequest
from provision.runner.tick_lock import TickSkip, current_tick, job_schedule, plan_tick
from provision.scheduler.on_core import ready_notifications
from provision.system.text import printable
from provision.workers.config import JobConfig, WorkerConfig, load_worker_config

Events = TextIO | logging.Logger | None
RUNNING_HERE = "a call of this job is still running in this process"
CLOSE_TIMEOUT = 30.0  # seconds close() waits for the runs in flight by default

# A keyed call's key: the key, or a function of the call's arguments that returns it
KeyOf = str | Callable[..., str]


class Locker:
    """The jobs of one worker's config, claimed and run from inside the app's process."""

    def __init__(
        self,
        consul: Consul,
        worker: str,
        jobs: Mapping[str, JobConfig],
        *,
        events: Events = None,
        isolation: Isolation = "thread",
        on_lost: OnLost = "flag",
        wall: AgentClock | None = None,
    ) -> None:
        self.consul, self.worker, self.jobs = consul, worker, dict(jobs)
        self.isolation, self.on_lost = isolation, on_lost
        self.wall = wall or AgentClock()
        self._stream = LoggerStream(events) if isinstance(events, logging.Logger) else events
        self._core: CallCore | None = None  # the calls' tick core, made at the first call
        self._stop = StopRequest()
        self._in_flight = 0
        self._running: set[str] = set()  # the jobs a call runs now (one call of a job at once)
        self._idle = threading.Condition()
        self.registered: dict[str, Callable[[], RunOutcome]] = {}  # the decorated calls
        self.served: dict[str, Served] = {}  # what serve() runs at each tick
        # the jobs' notifications, their URLs read by from_config/from_env (notify/)
        self.notify: tuple[JobNotify, ...] = ()

    # -- making one ------------------------------------------------------------------------
    @classmethod
    def from_config(cls, path: str | os.PathLike[str], **options: Any) -> Locker:
        """The worker config `lockctl worker-config` writes (its Consul address, token file,
        TLS files and jobs); what it names wins over Consul's environment variables."""
        config = load_worker_config(Path(path))
        settings = resolve_settings(**config.connection())
        return cls._connect(settings, config.worker, config, options)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **options: Any) -> Locker:
        """Consul's own variables (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT,
        CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY...) for the connection; the jobs from the worker
        config LOCKCTL_CONFIG names; LOCKCTL_WORKER, when set, must be that config's worker."""
        env = os.environ if environ is None else environ
        if not env.get("LOCKCTL_CONFIG"):
            raise InputError("LOCKCTL_CONFIG: not set (the worker config with the jobs)")
        config = load_worker_config(Path(env["LOCKCTL_CONFIG"]))
        worker = env.get("LOCKCTL_WORKER") or config.worker
        if worker != config.worker:
            raise InputError(
                f"LOCKCTL_WORKER: {worker!r}, but {config.path} is for {config.worker!r}"
            )
        settings = resolve_settings(env=env)
        return cls._connect(settings, worker, config, options)

    @classmethod
    def _connect(
        cls, settings: Any, worker: str, config: WorkerConfig, options: dict[str, Any]
    ) -> Locker:
        """The Locker of `config`'s jobs, their notifications' URL files read and checked first
        (InputError naming the config, the job and the file: nothing is connected then)."""
        scheduled = [job for job in config.jobs if job.schedule]
        notify = tuple(ready_notifications(scheduled, str(config.path)))
        wall = AgentClock()  # every decision about a tick is judged on Consul's clock
        consul = Consul(settings, agent_clock=wall)
        jobs = {job.name: job for job in config.jobs}
        locker = cls(consul, worker, jobs, wall=wall, **options)
        locker.notify = notify
        return locker

    def job(self, name: str, key: str | None = None) -> JobConfig:
        """A scheduled job of the worker's config, or one key of it (ValueError for a key
        that breaks the rule: refused, never escaped)."""
        job = self.jobs.get(name)
        if job is None or job.schedule is None:
            known = ", ".join(sorted(n for n, j in self.jobs.items() if j.schedule)) or "none"
            raise InputError(f"no scheduled job {name!r} for {self.worker} (jobs: {known})")
        if key is None:
            return job
        problem = key_problem(key)
        if problem is not None:
            shown = printable(key, 140) if isinstance(key, str) else type(key).__name__
            raise ValueError(f"job {name}: key '{shown}' {problem}")
        return job.keyed(key)

    # -- the decorator, the block, the call ------------------------------------------------
    def singleton(
        self,
        job: str,
        *,
        isolation: Isolation | None = None,
        on_lost: OnLost | None = None,
        key: KeyOf | None = None,
    ) -> Callable[[Callable[..., object]], Callable[..., RunOutcome]]:
        """`@locker.singleton("job")` on `def f(run, ...)`: each call of `f(...)` claims the
        job's current tick and runs the body here only if this replica won it; it returns a
        RunOutcome either way (ran, or skipped and why). `key`: a keyed job's key, a string, or
        a function of the call's arguments that returns it (`key=lambda tenant: tenant`): each
        key claims the tick under its own lock and ledger (docs/embedding.md)."""
        self.job(job)  # an unknown job fails at the decoration, not at the first tick

        def decorate(function: Callable[..., object]) -> Callable[..., RunOutcome]:
            @functools.wraps(function)
            def call(*args: Any, **kwargs: Any) -> RunOutcome:
                def body(run: Run) -> object:
                    return function(run, *args, **kwargs)

                chosen = key(*args, **kwargs) if callable(key) else key
                return self.call(job, body, isolation=isolation, on_lost=on_lost, key=chosen)

            self.registered[job] = call
            self.served[job] = Served(
                function, isolation or self.isolation, on_lost or self.on_lost
            )
            return call

        return decorate

    def call(
        self,
        job: str,
        body: Body,
        *,
        isolation: Isolation | None = None,
        on_lost: OnLost | None = None,
        key: str | None = None,
    ) -> RunOutcome:
        """Claim the tick of this moment and run `body(run)` if the claim is ours (with `key`,
        that key's tick, under its own lock and ledger)."""
        config = self.job(job, key)
        make = body_maker(config, body, isolation or self.isolation)
        return self._claim(config, make, on_lost or self.on_lost)

    async def run_async(self, call: Callable[[], RunOutcome]) -> RunOutcome:
        """Await a decorated job from asyncio: it runs in the loop's default executor, so the
        loop is never blocked by the claim or the body."""
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, call)

    @contextlib.contextmanager
    def tick(
        self, job: str, *, on_lost: OnLost | None = None, key: str | None = None
    ) -> Iterator[Claim]:
        """`with locker.tick("job") as claim:` for code that owns its loop: `claim.run` is the
        Run when this replica won the tick (the block is the body), else None and
        `claim.outcome` says why; after the block, `claim.outcome` is the run's. `key`: a keyed
        job's key, as for singleton."""
        config = self.job(job, key)
        holder: list[BlockBody] = []
        begun = threading.Event()
        claim = Claim()

        def make(events: RunEvents) -> ThreadBody:
            made = BlockBody(events, _deadline(config))
            made.begun = begun
            holder.append(made)
            return made

        failed: list[BaseException] = []

        def claim_it() -> None:
            try:
                claim.outcome = self._claim(config, make, on_lost or self.on_lost)
            except BaseException as exc:  # raised in the caller's thread, below
                failed.append(exc)
            finally:
                begun.set()  # not claimed (or failed): the block starts with no run

        helper = threading.Thread(target=claim_it, name=f"lockctl-embed-{job}", daemon=True)
        helper.start()
        begun.wait()
        if failed and not holder:
            helper.join()
            raise failed[0]
        body = holder[0] if holder and holder[0].run is not None else None
        claim.run = None if body is None else body.run
        try:
            yield claim
        except BaseException as exc:
            if body is not None:
                body.finish(1, exc)
            raise
        finally:
            if body is not None and body.exit_status is None:
                body.finish(0)
            helper.join()

    def _claim(
        self,
        config: JobConfig,
        make: Callable[[RunEvents], ThreadBody],
        on_lost: OnLost,
    ) -> RunOutcome:
        """The call's turn at the tick of this moment on the calls' core (embed/called.py)."""
        events = RunEvents(config.name, self.worker, self._stream, on_lost, config.key)  # type: ignore[arg-type]
        schedule = job_schedule(config)
        assert schedule is not None  # self.job() said so
        if not self._enter():
            return RunOutcome(Outcome.INTERRUPTED)
        if not self._begin(config.unit):
            self._leave()
            events.emit("skipped", reason=RUNNING_HERE)
            return RunOutcome(Outcome.SKIPPED, skip=SkipReason.OVERLAP)
        try:
            # The tick the caller's timer fired for, by the later of this host's clock and the
            # earliest the agent's may show (its Date has whole seconds: early on, that bound
            # lags by up to a second, and a call at :26.7 would be judged late for :24).
            # plan_tick then judges it on the agent's clock (the cheap skip of a taken tick),
            # and the core's turn judges it again on the agent's clock, and waits if that is
            # behind.
            now = current_tick(config, schedule, lambda: max(utc_now(), self.wall()))
            plan = plan_tick(
                Ledger(self.consul, config.lock_key), config, schedule, now, events, self.wall
            )
            if isinstance(plan, TickSkip):
                events.emit(plan.outcome.value, tick=tick_name(plan.tick), **plan.fields)
                return RunOutcome.of(RunResult(plan.outcome, 0, tick=plan.tick, skip=plan.skip))
            core = self._call_core()
            if core is None:  # close() came first
                events.emit("interrupted", signal=signal.Signals.SIGTERM.name)
                return RunOutcome(Outcome.INTERRUPTED, plan.tick)
            turn = call_turn(config, plan.tick, events, make, core.clock)
            found = core.take(turn)
            refusal = functools.partial(refusal_fields, self.consul)
            return outcome_of(found, turn, refusal, self._stop.signum)
        except ConsulError as exc:  # fail closed: no body runs without the claim
            events.emit("consul-unavailable", error=str(exc))
            return RunOutcome(Outcome.SKIPPED, skip=SkipReason.OTHER, error=str(exc))
        finally:
            self._end(config.unit)
            self._leave()

    def _call_core(self) -> CallCore | None:
        """The calls' core, made at the first call (its clock thread, then its sessions at
        the first claim); None once closing (close() reads it under the same lock)."""
        with self._idle:
            if self._stop.requested:
                return None
            if self._core is None:
                scheduled = tuple(job for job in self.jobs.values() if job.schedule)
                setting = CallSetting(
                    self.consul, self.wall, self.worker, self.stream, scheduled, self.notify
                )
                self._core = CallCore(setting)
            return self._core

    def _begin(self, job: str) -> bool:
        """A call of `job` may claim: False while another call of it runs here. Every call
        claims under the Locker's one session, and Consul lets a session acquire again a lock
        it holds: a second call (an app's timer firing again, max_instances > 1) would run the
        job beside the first, and its release would fence the first. (The core's own busy
        state would not do: a second turn there waits for the first run's end, and a turn
        whose read is under way is not busy yet.)"""
        with self._idle:
            if job in self._running:
                return False
            self._running.add(job)
            return True

    def _end(self, job: str) -> None:
        with self._idle:
            self._running.discard(job)

    def _enter(self) -> bool:
        """A run (or serve()) starts: close() waits for it; False once closing."""
        with self._idle:
            if self._stop.requested:
                return False
            self._in_flight += 1
            return True

    def _leave(self) -> None:
        with self._idle:
            self._in_flight -= 1
            self._idle.notify_all()

    # -- serving, closing, reading ---------------------------------------------------------
    def serve(self, stop: threading.Event | None = None) -> None:
        """Run every decorated job at each of its ticks on the tick core, as `lockctl
        schedule` runs a worker's jobs (embed/served.py: the claim order, catch-up, pauses, the
        overlap skips), until `stop` is set (the runs under way end as they will) or close() is
        called (they are told to stop); returns once they have ended."""
        if self._enter():
            try:
                serve_on_core(self._app_jobs(), stop or threading.Event())
            finally:
                self._leave()

    def _app_jobs(self) -> AppJobs:
        jobs = []
        for name, served in self.served.items():
            for unit in self.job(name).units():  # a keyed job's spec keys: each its own
                make = body_maker(unit, served.function, served.isolation)
                jobs.append(AppJob(unit, make, served.on_lost))
        return AppJobs(
            self.consul,
            self.wall,
            self.worker,
            self.stream,
            tuple(jobs),
            lambda: self.stopping,
            self.notify,
        )

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Stop claiming, tell the runs in flight to stop (their records completed, their locks
        released, as a stopped `lockctl schedule` does), then destroy the sessions: another
        replica takes the next tick at once, without LockDelay."""
        self._stop.request(signal.SIGTERM)
        with self._idle:
            core = self._core
        if core is not None:
            core.stop()  # the calls' runs told to stop (serve() sees the request itself)
        give_up = time.monotonic() + timeout
        with self._idle:
            self._idle.wait_for(lambda: self._in_flight == 0, timeout)
            core = self._core  # made by a call that began before the stop was asked
        if core is not None:
            core.stop()
            core.close(max(0.0, give_up - time.monotonic()))

    @property
    def sessions(self) -> list[str]:
        """The calls' sessions alive now (none before the first claim, none after close())."""
        core = self._core
        return [] if core is None else list(core.live)

    def __enter__(self) -> Locker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stopping(self) -> bool:
        return self._stop.requested

    @property
    def stop_request(self) -> StopRequest:
        """What close() sets: every run of this Locker stops on it."""
        return self._stop

    @property
    def stream(self) -> TextIO | None:
        """Where the events go (a logging.Logger's, as a stream)."""
        return self._stream  # type: ignore[return-value]

    def history(self, job: str, limit: int = 20) -> JobHistory:
        """The job's newest `limit` ticks from the ledger (what `lockctl history` shows)."""
        return read_history(self.consul, _ledger_job(self.job(job)), wanted=Wanted(limit))

    def check(self, job: str) -> JobHealth:
        """The job's health by `lockctl check`'s rules (ok, warning, critical, and why)."""
        config = self.job(job)
        history = read_history(self.consul, _ledger_job(config))
        return assess(history, config.timings.start_deadline)


@dataclass(frozen=True)
class Served:
    """A decorated job as serve() runs it: its function, where it runs, what a loss does."""

    function: Body
    isolation: Isolation
    on_lost: OnLost


def body_maker(
    config: JobConfig, body: Body, isolation: Isolation
) -> Callable[[RunEvents], ThreadBody]:
    """What makes a run's body of `body`, told of the run through its events."""
    kind = ProcessBody if isolation == "process" else ThreadBody
    deadline = _deadline(config)
    return lambda events: kind(body, events, deadline)


class Claim:
    """What `locker.tick()` yields: `run` (None: not ours) and `outcome` (the skip at once;
    the run's after the block)."""

    def __init__(self) -> None:
        self.run: Run | None = None
        self.outcome: RunOutcome | None = None

    def __bool__(self) -> bool:
        return self.run is not None


def _deadline(job: JobConfig) -> Callable[[datetime], datetime | None]:
    """When the body should be done, from its tick: the job's timeout, else the next tick."""
    schedule = job_schedule(job)
    timeout = job.timings.timeout

    def deadline(tick: datetime) -> datetime | None:
        if timeout is not None:
            return tick + timedelta(seconds=timeout)
        return None if schedule is None else schedule.next_ticks(tick, 1)[0]

    return deadline


def _ledger_job(job: JobConfig) -> LedgerJob:
    schedule = job_schedule(job)
    assert schedule is not None
    return LedgerJob(
        job.name,
        job.lock_key,
        schedule,
        job.timings.start_deadline,
        job.history_limit,
        job.blackouts,
    )
