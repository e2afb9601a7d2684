# The C layout of collectives.py's message fabric in the compiled engine (setup.py; Cython's
# "augmenting .pxd": collectives.py stays the source). Clocks, bytes left and counters are C
# doubles and ints; _solo's and complete_s's arithmetic runs on typed locals: the same
# operations on the same doubles in the same order.

cimport cython


@cython.final
cdef class _Flow:
    cdef public object group
    cdef public Handle handle
    cdef public long phase
    cdef public double start_s, left_bytes


@cython.final
cdef class Handle:
    cdef public object plan, done_s, children, parent, layer
    cdef public long phase, groups_left
    cdef public double phase_land_s
    cdef public bint waited


@cython.final
cdef class MessageFabric:
    cdef public double now_s, pending_s, last_land_s
    cdef public bint lazy
    cdef public object pending, solo, recorder
    cdef public dict active, busy_s
    cdef public long flowing, sequence
    cdef public list starts, spans, unwaited_parents

    @cython.locals(last_land_s=double, now_s=double, phase_start_s=double, phase_land_s=double,
                   issued_s=double, count=long, left=long, ahead=long, left_bytes=double, rate=double,
                   next_s=double, finish_s=double, elapsed=double, drained_bytes=double,
                   land_s=double, starts=list, busy_steps=list, links=list, sequence=long)
    cpdef _solo(self, Handle handle, double before_s=*)

    @cython.locals(issued_s=double, sequence=long, starts=list)
    cpdef _start_phase(self, Handle handle, long phase, double time_s)

    @cython.locals(handle=Handle, land_s=double)
    cpdef _drained(self, _Flow flow)

    @cython.locals(starts=list, busy=dict, now_s=double, next_s=double, flow=_Flow, rate=double,
                   finish_s=double, elapsed=double, drained_bytes=double)
    cpdef complete_s(self, Handle handle)
