# The C layout of loop.py's Driver in the compiled engine (setup.py; Cython's "augmenting .pxd":
# loop.py stays the source). EventLoop stays a Python class (it extends simpy.Environment).

cimport cython


@cython.final
cdef class Driver:
    cdef public object loop, send, resume_fn
    cdef public bint alive

    @cython.locals(queue=list, time_s=double)
    cpdef resume(self, _arg=*)
