# The C layout of hbm.py's HbmServer in the compiled engine (setup.py; Cython's "augmenting
# .pxd": hbm.py stays the source). Its clock, rates and counters are C doubles and ints; a
# turn's locals are typed so its arithmetic is C arithmetic on the same doubles in the same
# order (IEEE, no contraction: setup.py).

cimport cython

from tpusim.engine.items cimport Descriptor, Slab
from tpusim.engine.loop cimport Clock


@cython.locals(seq=long, at=Py_ssize_t, other=Descriptor)
cdef insert_streaming(list streaming, Descriptor desc, double target, Py_ssize_t first=*)


@cython.final
cdef class HbmServer:
    cdef public Clock env
    cdef public object bandwidth, on_free, recorder, events, ready, wake_fn
    cdef public long run, max_in_flight, issue_count, in_flight, issued, wake_token, turns_ahead
    cdef public Py_ssize_t first, start_at
    cdef public long long bytes_moved
    cdef public double latency_s, virtual_bytes, rate, last_s, busy_s, last_land_s, wake_at
    cdef public bint by_stream, in_order, direct
    cdef public list rate_by_n, aggregate_by_k, queue, streaming, starting, free_lanes
    cdef public dict streams

    @cython.locals(elapsed=double)
    cpdef _advance(self, double now)

    @cython.locals(next_s=double, head=double, left=double, finish=double, first=Descriptor, streaming=list, starting=list,
                   token=long, count=long, env=Clock, at=Py_ssize_t, start_at=Py_ssize_t, entry=tuple)
    cpdef _reschedule(self, double now)

    @cython.locals(in_flight=long, max_in_flight=long, issued=long, now=double, elapsed=double,
                   latency_s=double, start_s=double, desc=Descriptor, group=list)
    cpdef bint _issue(self)

    @cython.locals(run=long, now=double, elapsed=double, limit=double, virtual_bytes=double,
                   next_s=double, finish=double, left_bytes=double, time_s=double, desc=Descriptor,
                   slab=Slab, by_stream=bint, in_order=bint, run_ahead=bint, count=long,
                   streaming=list, queue=list, head=double, start_s=double, ahead=bint,
                   slack=double, tolerance=double, inf=double, starting=list, env=Clock, group=list,
                   first=Py_ssize_t, landed=Py_ssize_t, size=Py_ssize_t, at=Py_ssize_t, start_at=Py_ssize_t,
                   compact_at=Py_ssize_t, entry=tuple)
    cpdef _wake(self, long token)
