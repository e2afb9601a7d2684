"""The compute stream: one in-order instruction stream driving the MXU and the VPU.

A TensorCore runs the megakernel's body as a single sequence of ops; the MXU and the VPU
are its two servers. Because the stream issues one piece at a time and waits for it, a
unit never has a queue: in SimPy terms each is a ``Resource(capacity=1)`` whose only user is
this process, so the engine keeps their busy time instead of modelling the queue. What the
stream *does* wait for is other resources:

- **copies** — before computing on a slab it waits until the slab's copies have landed
  (``dma_wait``); that wait is the exposed DMA time;
- **links** — a collective run as remote copies (:mod:`tpusim.engine.collectives`) is
  issued at the end of its op and the stream waits for it only at the op that consumes it;
  a stage-priced blocking collective occupies the stream for its stages; an overlapped one
  runs on the link while the stream goes on, and the op that consumes its result waits for
  it (:mod:`tpusim.engine.build` names that op).

The stream is a generator driven by :class:`tpusim.engine.loop.Driver` (as a SimPy process
would be: it yields a delay, or waits for a copy's landing). Where nothing is recorded, an op's
pieces run in C (:class:`PieceRun`, the same steps), handed to the driver while they sleep or
wait; so does a run of consecutive plain ops (no layer start, kernel launch or collective: a
layer's routed experts), op after op, unless the event-by-event reference loop runs. Per op ``i`` it does (pseudocode of :func:`compute_stream`)::

    if op starts a layer: wait per_layer_overhead   # (or, per_layer_overhead_at each_op:
                                                #  wait its share at every op of the layer)
    wait op.launch_s                            # the kernel launches the policy charges here
    wait op.kernel_fixed_s                      # their fixed time and ramp (serving stack)
    wait for overlapped collectives and message collectives consumed here
    release slabs whose issue point is "op i starts"   -> copies admitted / issued
    for piece in op.pieces:
        dma_wait on piece.waits (exposed DMA if not landed)
        compute piece.duration on piece.unit
        free piece.frees; release piece.releases; queue piece.writes
    release slabs whose issue point is "op i ends"; drop mispredicted expert copies
    run the op's collectives (a launch first if the call is its own kernel;
                              messages: issue on the fabric; blocking: wait;
                              overlapped: hand to the link)

Kernel launches (per-op launch execution, NCCL kernels, a GPU megakernel's one launch) are
recorded on a ``launch`` track of the timeline, labelled with the kernels launched.

Stage-priced links are FIFO servers with a known finishing time (no sharing, no
randomness), so they are plain ``free_at`` clocks rather than SimPy processes; message
collectives share the links as a fluid (:class:`~tpusim.engine.collectives.MessageFabric`),
run lazily up to the time the stream asks about.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from tpusim.engine.build import Lowered
from tpusim.engine.collectives import Handle, MessageFabric
from tpusim.engine.hbm import HbmServer
from tpusim.engine.items import MXU, UNIT_NAMES, VPU, CollectivePlan, OpPlan
from tpusim.engine.loop import Driver, EventLoop, Steps
from tpusim.engine.staging import StagingMemory
from tpusim.engine.timeline import Recorder

STEPS_AT = 14  # where an op row's steps begin (_op_rows)


@dataclass(slots=True)
class StreamAccount:
    """Where the compute stream's time went (seconds)."""

    compute_by_phase: dict[str, float] = field(default_factory=dict)
    unit_busy: list[float] = field(default_factory=lambda: [0.0, 0.0])
    exposed_dma_s: float = 0.0
    exposed_by_family: dict[str, float] = field(default_factory=dict)
    collective_s: float = 0.0
    fixed_s: float = 0.0  # per step, per layer, kernel launches and kernel fixed time
    launch_s: float = 0.0  # the kernel-launch part of fixed_s
    kernel_fixed_s: float = 0.0  # the kernel fixed-time part of fixed_s (serving stack)
    op_time_s: list[float] = field(default_factory=list)  # per op: its start (launches) to its end (collectives)
    launch_count: int = 0
    stream_end_s: float = 0.0
    overlapped_end_s: float = 0.0
    layer_start_s: list[tuple[int, float]] = field(default_factory=list)
    link_busy: dict[str, float] = field(default_factory=dict)


class Links:
    """FIFO link servers: each stage starts when both the caller and the link are ready."""

    def __init__(self, recorder: Recorder | None, *, solo: bool = True) -> None:
        self.free_at: dict[str, float] = {}
        self.busy: dict[str, float] = {}
        self.recorder = recorder
        self.fabric = MessageFabric(recorder, solo=solo)  # solo=False: the reference (no _solo pricing)

    def run(self, call: CollectivePlan, start_s: float) -> float:
        """Run ``call``'s stages from ``start_s``; return when the last stage ends."""
        time_s = start_s
        for link, duration in call.stages:
            begin = max(time_s, self.free_at.get(link, 0.0))
            time_s = begin + duration
            self.free_at[link] = time_s
            self.busy[link] = self.busy.get(link, 0.0) + duration
            if self.recorder is not None:
                self.recorder.interval(f"link {link}", begin, time_s, call.name)
        return time_s


class PieceRun(Steps):
    """An op's pieces, run without leaving C (compiled: ``stream.pxd``) until the compute stream
    must sleep or wait: :func:`compute_stream`'s piece loop where nothing is recorded (a sweep's
    run; with a recorder or events the stream runs its own loop, the same steps inline). The
    same operations in the same order: each unit's busy time, the phase's compute and the
    exposed DMA are summed here in the stream's order, and the stream stores them at the end.

    :meth:`start` runs an op's pieces from the first; :meth:`proceed` goes on after the stream
    slept or waited. Each returns 0 when the op's pieces are done, 1 to sleep :attr:`delay`, or
    2 to wait for the copy :attr:`desc` (its ``waiter`` set to the stream's resumption). The
    stream hands a run not done to its driver (:class:`~tpusim.engine.loop.Steps`), which
    resumes it, not the generator, until it is done."""

    __slots__ = ("ahead", "at", "by_phase", "consumed", "desc", "env", "exposed_by_family", "exposed_dma_s",
                 "hbm", "joins", "mxu_busy_s", "op_at", "op_end", "op_start", "op_times", "phase", "phase_s",
                 "phase_set", "pieces", "queue", "resume", "rows", "run", "run_ahead", "stage", "staging",
                 "vpu_busy_s", "wait_start", "waited")

    def __init__(self, env: EventLoop, staging: StagingMemory, hbm: HbmServer, run: int, resume: Any,
                 account: StreamAccount) -> None:
        self.env, self.staging, self.hbm, self.run, self.resume = env, staging, hbm, run, resume
        self.queue, self.run_ahead = env._queue, env.run_ahead
        self.by_phase, self.exposed_by_family = account.compute_by_phase, account.exposed_by_family
        self.mxu_busy_s, self.vpu_busy_s = account.unit_busy
        self.exposed_dma_s = account.exposed_dma_s
        self.ahead = 0  # pieces run ahead (added to env.ran_ahead at the end)
        self.pieces: tuple[Any, ...] = ()  # the op's row: its pieces from STEPS_AT (_op_rows)
        self.phase: str = ""
        self.phase_s, self.phase_set = 0.0, False
        self.at = self.waited = self.stage = 0  # where it stopped: piece (its place in the row), its wait, 1 waiting / 2 computing
        self.delay, self.wait_start = 0.0, 0.0
        self.waiting = False
        self.desc: Any = None
        # a run of plain ops (start_ops): the stream's rows, the op running and the run's end (0:
        # one op's pieces only, start), the op's start; what the stream's op steps read and write
        self.rows: list[tuple[Any, ...]] = []
        self.op_at = self.op_end = 0
        self.op_start = 0.0
        self.op_times = account.op_time_s
        self.joins: dict[int, float] = {}
        self.consumed: dict[int, list[Handle]] = {}

    def start(self, row: tuple[Any, ...], phase: str) -> int:
        """Run the pieces of an op (its row: _op_rows) from the first (its phase: where their
        compute is summed)."""
        self.pieces, self.phase = row, phase
        self.phase_s, self.phase_set = 0.0, False
        self.at = STEPS_AT
        self.waited = self.stage = 0
        self.op_end = 0
        return self.proceed()

    def start_ops(self, rows: list[tuple[Any, ...]], at: int, end: int) -> int:
        """Run the plain ops ``rows[at:end]`` (:func:`compute_stream`'s op steps for an op that
        starts no layer, launches no kernel and runs no collective: its start releases, its
        pieces, its end releases and resolutions, its time) one after another, as the stream
        would, until one is waited for by a collective (``joins``, ``consumed``: the stream
        does that one, from :attr:`op_at`). Returns as :meth:`proceed`; done, :attr:`op_at` is
        the first op not run. The op at ``at`` is not waited for (the stream checked)."""
        self.rows, self.op_at, self.op_end = rows, at, end
        self.enter_op(rows[at])
        return self.proceed()

    def enter_op(self, row: tuple[Any, ...]) -> None:
        """Begin the op of ``row`` (one of :attr:`rows`): its start time, its start releases, its
        pieces from the first."""
        self.op_start = self.env.now
        staging = self.staging
        staging.current_op = row[5]
        start_releases = row[6]
        if start_releases:
            staging.release_many(start_releases)
        self.pieces, self.phase = row, row[7]
        self.phase_s, self.phase_set = 0.0, False
        self.at = STEPS_AT
        self.waited = self.stage = 0

    def proceed(self) -> int:
        """Go on from where it stopped (see the class docstring for what it returns)."""
        env = self.env
        run = self.run
        while True:  # an op's pieces; in a run of plain ops (start_ops), then the next op's
            pieces = self.pieces  # the op's row: its pieces are its steps from STEPS_AT (_op_rows)
            at = self.at  # where the piece begins in it
            stage = self.stage
            count = len(pieces)
            while at < count:
                duration = pieces[at]
                n = pieces[at + 2]  # its waits: pieces[at + 6:at + 6 + n], then its frees
                if stage == 1:  # back from a wait: its exposed time
                    stalled = env.now - self.wait_start
                    self.exposed_dma_s += stalled
                    family = self.desc.family
                    self.exposed_by_family[family] = self.exposed_by_family.get(family, 0.0) + stalled
                    self.desc = None
                    self.waited += 1
                    stage = 0
                if stage == 0:  # its waits (from the one after the last waited for), then its compute
                    w = self.waited
                    while w < n:
                        desc = pieces[at + 6 + w]
                        if desc.landed != run:  # exposed DMA: wait until it lands
                            self.wait_start = env.now
                            desc.waiter = self.resume
                            self.desc = desc
                            self.at, self.waited, self.stage = at, w, 1
                            self.waiting = True
                            return 2
                        w += 1
                    if duration > 0.0:
                        time_s = env.now + duration
                        queue = self.queue
                        ahead = self.run_ahead
                        if ahead and queue:  # running ahead (loop): every queued entry is later
                            entry = queue[0]  # (typed when compiled: a tuple read in C)
                            head = entry[0]  # (typed when compiled: compared unboxed)
                            ahead = head > time_s
                        if ahead:
                            env.now = time_s
                            self.ahead += 1
                        else:
                            self.delay = duration
                            self.at, self.stage = at, 2
                            self.waiting = False
                            return 1
                # the piece's compute has ended
                if duration > 0.0:
                    if pieces[at + 1]:  # (VPU = 1, MXU = 0)
                        self.vpu_busy_s += duration
                    else:
                        self.mxu_busy_s += duration
                    if not self.phase_set:
                        self.phase_s = self.by_phase.get(self.phase, 0.0)
                        self.phase_set = True
                    self.phase_s += duration
                staging = self.staging
                f = at + 6 + n  # its frees
                n = f + pieces[at + 3]  # (where the next piece begins)
                while f < n:
                    slab = pieces[f]
                    staging.free(slab)
                    f += 1
                releases = pieces[at + 4]
                if releases:
                    staging.release_many(releases)
                writes = pieces[at + 5]
                if writes:
                    hbm = self.hbm
                    for desc in writes:
                        hbm.enqueue(desc)
                    hbm.pump()
                at = n
                stage = 0
                self.waited = 0
            if self.phase_set:
                self.by_phase[self.phase] = self.phase_s
            self.at, self.stage = at, 0
            if not self.op_end or not self.next_op():
                return 0

    def next_op(self) -> bool:
        """In a run of plain ops (:meth:`start_ops`), after an op's pieces: the op's end (its
        end releases, its resolutions, its time), then the next op's start, as the stream does
        them. False when the run is done or the next op is the stream's (waited for)."""
        env = self.env
        staging = self.staging
        row = self.rows[self.op_at]
        end_releases = row[9]
        if end_releases:
            staging.release_many(end_releases)
        for slab in row[10]:
            staging.resolve(slab)
        self.op_times.append(env.now - self.op_start)
        at = self.op_at + 1
        self.op_at = at
        if at == self.op_end:
            self.op_end = 0
            return False
        row = self.rows[at]
        if row[13] and (row[3] in self.joins or row[3] in self.consumed):  # the stream waits for its collectives
            self.op_end = 0
            return False
        self.enter_op(row)
        return True


def compute_stream(env: EventLoop, driver: Driver, lowered: Lowered, hbm: HbmServer, staging: StagingMemory,
                   links: Links, account: StreamAccount, *, per_step_s: float, per_layer_s: float,
                   per_layer_each_op: bool = False, recorder: Recorder | None,
                   events: list[tuple[Any, ...]] | None) -> Generator[float | None, None, None]:
    """The compute stream, run by ``driver`` (see the module docstring): yields a delay to
    sleep, or None while a copy it waits on (``desc.waiter = driver.resume``) has not landed."""
    joins: dict[int, float] = {}
    consumed: dict[int, list[Handle]] = {}  # op index -> message collectives it waits for
    exposed_by_family, unit_busy, by_phase = account.exposed_by_family, account.unit_busy, account.compute_by_phase
    run = lowered.runs  # a copy has landed in this run when its ``landed`` is this number (items)
    queue, run_ahead = env._queue, env.run_ahead
    resume = driver.resume  # what a landing queues for a copy waited on (bound once)
    free, release_many = staging.free, staging.release_many  # (bound once: called per piece)
    now = env.now  # the clock, kept here: each resumption sends it (Driver.resume), running ahead sets it
    if per_step_s > 0.0:
        now = yield per_step_s
        account.fixed_s += per_step_s
    # the per-layer cost in one block at the layer's start, or (per_layer_each_op) an equal share
    # at each of its ops' starts: the layer's own code, which the copies in flight run under
    share_by_layer: dict[int, float] = {}
    if per_layer_s > 0.0 and per_layer_each_op:
        for op in lowered.ops:
            if op.layer >= 0:
                share_by_layer[op.layer] = share_by_layer.get(op.layer, 0.0) + 1.0
        for layer in share_by_layer:
            share_by_layer[layer] = per_layer_s / share_by_layer[layer]
    block_s = per_layer_s if not share_by_layer else 0.0
    rows = lowered.op_rows  # each op's fields the loop reads, as one tuple (Lowered.op_rows)
    if rows is None:  # (its pieces as plain tuples: a NamedTuple unpacks through the iterator protocol)
        rows = lowered.op_rows = _op_rows(lowered)
    op_times = account.op_time_s
    pieces_ahead = 0  # pieces run ahead (added to env.ran_ahead at the end: only a count)
    mxu_busy_s, vpu_busy_s = unit_busy  # each unit's busy time, summed here in order, stored at the end
    # nothing recorded: the pieces run in C (PieceRun), the same steps as the loop below
    runner = PieceRun(env, staging, hbm, run, resume, account) if recorder is None and events is None else None
    if runner is not None:
        runner.joins, runner.consumed = joins, consumed
    # runs of plain ops in C (PieceRun.start_ops); the event-by-event reference does each op here
    plain_runs = runner is not None and not share_by_layer and run_ahead
    at, count = 0, len(rows)
    while at < count:
        row = rows[at]
        op, layer, first, index, launched, name, start_releases, phase, pieces, end_releases, resolves, collectives, \
            end, joined = row[:STEPS_AT]
        if end and plain_runs and not (joined and (index in joins or index in consumed)):
            # a run of plain ops (_op_rows), their op steps below, in C until one is waited for
            if runner.start_ops(rows, at, end):  # asleep or waiting: the driver runs the rest
                now = yield runner
            else:
                now = env.now
            at = runner.op_at
            continue
        at += 1
        if first:
            account.layer_start_s.append((layer, now))
            if recorder is not None:
                recorder.layer_start(layer, now)
            if block_s > 0.0 and layer >= 0:
                now = yield block_s
                account.fixed_s += block_s
        if share_by_layer and layer >= 0:
            share_s = share_by_layer[layer]
            now = yield share_s
            account.fixed_s += share_s
        op_start = now
        if launched:
            yield from _launch(env, op, account, recorder)
            now = env.now
        if joined and (index in joins or index in consumed):  # (a plain call: most joins do not wait)
            join_s = _join_s(now, op, links, joins, consumed, events)
            if join_s > now:
                start = now
                now = yield join_s - start
                account.collective_s += join_s - start
                if recorder is not None:
                    recorder.interval("wait", start, join_s, "collective join")
        if first:  # (else the layer it holds already)
            staging.current_layer = layer
        staging.current_op = name
        if start_releases:
            release_many(start_releases)
        if events is not None:
            events.append(("compute", name, layer))
        if runner is not None:  # (PieceRun: the loop below, compiled)
            if runner.start(row, phase):  # asleep or waiting: the driver runs the rest (Driver.resume)
                now = yield runner
            else:
                now = env.now
            pieces = ()
        # the op's pieces (inlined here: one generator frame per resumption, none per op); the
        # phase's compute summed here in order and stored at the op's end (no one reads it between)
        phase_s: float | None = None
        for duration, unit, waits, frees, releases, writes in pieces:
            for desc in waits:
                if events is not None:
                    events.append(("dma_wait", desc.family, desc.tensor, desc.layer, desc.chunk))
                if desc.landed != run:  # exposed DMA: sleep until it lands
                    start = now
                    desc.waiter = resume
                    now = yield None
                    stalled = now - start
                    account.exposed_dma_s += stalled
                    exposed_by_family[desc.family] = exposed_by_family.get(desc.family, 0.0) + stalled
                    if recorder is not None:
                        recorder.interval("wait", start, now, f"wait {desc.tensor} L{desc.layer}")
            if duration > 0.0:
                start = now
                time_s = start + duration
                if run_ahead and (not queue or queue[0][0] > time_s):  # Driver.resume's running ahead,
                    env.now = now = time_s  # taken here without leaving the generator (tpusim.engine.loop)
                    pieces_ahead += 1
                else:
                    now = yield duration
                if unit:  # (VPU = 1, MXU = 0)
                    vpu_busy_s += duration
                else:
                    mxu_busy_s += duration
                phase_s = (by_phase.get(phase, 0.0) if phase_s is None else phase_s) + duration
                if recorder is not None:
                    recorder.interval(UNIT_NAMES[unit], start, now, f"{name} L{layer}")
            for slab in frees:
                free(slab)
            if releases:
                release_many(releases)
            if writes:
                for desc in writes:
                    hbm.enqueue(desc)
                hbm.pump()
        if phase_s is not None:
            by_phase[phase] = phase_s
        if end_releases:
            release_many(end_releases)
        for slab in resolves:
            staging.resolve(slab)
        if collectives:
            # message collectives issue without waiting: a generator only from the first staged one
            issued: dict[str, Handle] = {}
            for position, call in enumerate(collectives):
                if call.messages is None:
                    yield from _run_collectives(env, op, position, issued, links, account, recorder, joins,
                                                consumed, events)
                    now = env.now
                    break
                _issue_messages(links.fabric, call, now, issued, consumed, layer, events)
        op_times.append(now - op_start)
    account.stream_end_s = now
    if runner is not None:
        mxu_busy_s, vpu_busy_s, pieces_ahead = runner.mxu_busy_s, runner.vpu_busy_s, runner.ahead
        account.exposed_dma_s = runner.exposed_dma_s
    unit_busy[MXU], unit_busy[VPU] = mxu_busy_s, vpu_busy_s
    env.ran_ahead += pieces_ahead
    _finish_links(links, account)


def _op_rows(lowered: Lowered) -> list[tuple[Any, ...]]:
    """Each op's fields the stream reads, as one tuple (its pieces as plain tuples: a NamedTuple
    unpacks through the iterator protocol), then the end of the run of plain ops from it (0: not
    plain) and whether a collective names it as its consumer (only such an op can be waited for:
    ``joins`` and ``consumed`` are keyed by ``join_op_index``). A plain op starts no layer,
    launches no kernel and runs no collective: the stream's steps for it are its releases, its
    pieces and its time (PieceRun.start_ops).

    The op's pieces are there twice: as plain tuples ``(duration, unit, waits, frees, releases,
    writes)`` (the row's ``pieces``) for the stream's own loop (a recorded run), and as the steps
    :class:`PieceRun` reads, in the row itself from :data:`STEPS_AT` on, each ``duration, unit,
    n, m, releases, writes`` then its ``n`` waits and ``m`` frees: a row is one object, an op's
    pieces, their waits and frees read from it (their first touch in a step is a cache miss, and
    so was each container's: K3 at batch 8 reads some 8,000 pieces a step). The start releases
    are copied into a tuple (one object, a list's items are a second). The same members in the
    same order: the run reads them, never their identity."""
    ops = lowered.ops
    plain = [not op.first_of_layer and not (op.launch_s > 0.0 or op.kernel_fixed_s > 0.0) and not op.collectives
             for op in ops]
    consumers = {call.join_op_index for op in ops for call in op.collectives}
    ends = [0] * len(ops)
    end = 0
    for position in range(len(ops) - 1, -1, -1):
        if plain[position]:
            if not end:
                end = position + 1
            ends[position] = end
        else:
            end = 0
    rows = []
    for position, op in enumerate(ops):
        pieces = tuple([tuple(piece) for piece in op.pieces])
        row = [op, op.layer, op.first_of_layer, op.index, op.launch_s > 0.0 or op.kernel_fixed_s > 0.0, op.name,
               tuple(op.start_releases), op.phase, pieces, op.end_releases, op.resolves, op.collectives,
               ends[position], op.index in consumers]
        for duration, unit, waits, frees, releases, writes in pieces:  # (tuple() of a tuple: itself)
            row.append(duration)
            row.append(unit)
            row.append(len(waits))
            row.append(len(frees))
            row.append(tuple(releases))
            row.append(tuple(writes))
            row.extend(waits)
            row.extend(frees)
        rows.append(tuple(row))
    return rows


def _launch(env: EventLoop, op: OpPlan, account: StreamAccount,
            recorder: Recorder | None) -> Generator[float | None, None, None]:
    """Before an op computes: its kernel launches and fixed time."""
    if op.launch_s > 0.0:
        start = env.now
        yield op.launch_s
        account.fixed_s += op.launch_s
        account.launch_s += op.launch_s
        account.launch_count += op.launches
        if recorder is not None:
            recorder.interval("launch", start, env.now, op.kernel or f"launch {op.name}")
    if op.kernel_fixed_s > 0.0:
        start = env.now
        yield op.kernel_fixed_s
        account.fixed_s += op.kernel_fixed_s
        account.kernel_fixed_s += op.kernel_fixed_s
        if recorder is not None:
            recorder.interval("launch", start, env.now, f"kernel fixed time {op.name}")


def _join_s(now: float, op: OpPlan, links: Links, joins: dict[int, float], consumed: dict[int, list[Handle]],
            events: list[tuple[Any, ...]] | None) -> float:
    """Then (after :func:`_launch`): when the collectives the op consumes are done (seconds;
    ``now``: the clock)."""
    join_s = joins.pop(op.index, 0.0)
    wait_s = now  # message collectives are waited one after another, in plan order
    for handle in consumed.pop(op.index, ()):
        if events is not None:
            events.append(("collective_wait", handle.plan.name, handle.layer, op.layer))
        done_s, chained = links.fabric.wait(handle, wait_s)
        wait_s = max(wait_s, done_s)
        if events is not None:
            events.extend(("collective_issue", child.plan.name, child.layer, op.layer) for child in chained)
    return max(join_s, wait_s)


def _run_collectives(env: EventLoop, op: OpPlan, first: int, issued: dict[str, Handle], links: Links,
                     account: StreamAccount, recorder: Recorder | None, joins: dict[int, float],
                     consumed: dict[int, list[Handle]],
                     events: list[tuple[Any, ...]] | None) -> Generator[float | None, None, None]:
    """After an op, from its collective ``first`` on (``issued``: the messages issued before it):
    message collectives are issued (their consumer waits); staged ones run on their links,
    overlapped (joined later) or blocking the stream now."""
    for call in op.collectives[first:]:
        if call.messages is not None:
            _issue_messages(links.fabric, call, env.now, issued, consumed, op.layer, events)
            continue
        if call.launch_s > 0.0:
            start = env.now
            yield call.launch_s
            account.fixed_s += call.launch_s
            account.launch_s += call.launch_s
            account.launch_count += 1
            if recorder is not None:
                recorder.interval("launch", start, env.now, f"launch {call.name}")
        end = links.run(call, env.now)
        if call.overlapped:
            joins[call.join_op_index] = max(joins.get(call.join_op_index, 0.0), end)
            account.overlapped_end_s = max(account.overlapped_end_s, end)
        elif end > env.now:
            start = env.now
            yield end - start
            account.collective_s += end - start
            if recorder is not None:
                recorder.interval("wait", start, end, call.name)


def _issue_messages(fabric: MessageFabric, call: CollectivePlan, now_s: float, issued: dict[str, Handle],
                    consumed: dict[int, list[Handle]], layer: int, events: list[tuple[Any, ...]] | None) -> None:
    """Issue a message collective (a chained one once its parent is waited for); its
    consumer will wait on it. Events: ``("collective_issue", name, issuing layer, layer)``
    when the copies start (a chain's at the wait that starts it, :func:`_join_s`)."""
    assert call.messages is not None
    parent = issued.get(call.messages.parent or "")
    handle = fabric.issue(call.messages, now_s, parent, layer)
    issued[call.name] = handle
    consumed.setdefault(call.join_op_index, []).append(handle)
    if events is not None and (parent is None or parent.waited):
        events.append(("collective_issue", call.name, layer, layer))


def _finish_links(links: Links, account: StreamAccount) -> None:
    """Copies still in flight land (they bound the step); busy time of both link models."""
    account.overlapped_end_s = max(account.overlapped_end_s, links.fabric.finish())
    account.link_busy = dict(links.busy)
    for link, busy in links.fabric.busy_s.items():
        account.link_busy[link] = account.link_busy.get(link, 0.0) + busy
