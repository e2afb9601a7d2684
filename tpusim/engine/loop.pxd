# The C layout of loop.py's Clock and Driver in the compiled engine (setup.py; Cython's
# "augmenting .pxd": loop.py stays the source). EventLoop stays a Python class (it extends
# Clock and simpy.Environment); the engine's hot modules hold it typed as a Clock.

cimport cython


cdef class Clock:
    cdef public double now
    cdef public list _queue
    cdef public long scheduled, ran_ahead
    cdef public bint run_ahead

    @cython.locals(queue=list, entry=tuple)
    cpdef run_queue(self)


cdef class Steps:
    cdef public double delay
    cdef public bint waiting

    cpdef long proceed(self)


@cython.final
cdef class Driver:
    cdef public Clock loop
    cdef public object send, resume_fn
    cdef public Steps steps
    cdef public bint alive, fresh

    @cython.locals(queue=list, time_s=double, loop=Clock, steps=Steps, count=long, head=double, entry=tuple)
    cpdef resume(self, _arg=*)
