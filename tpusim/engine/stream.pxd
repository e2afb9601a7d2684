# The C layout of stream.py's PieceRun in the compiled engine (setup.py; Cython's "augmenting
# .pxd": stream.py stays the source). An op's pieces run as C: the clock, the staging memory
# and the HBM server typed, the sums C doubles added in the stream's order.

cimport cython

from tpusim.engine.hbm cimport HbmServer
from tpusim.engine.items cimport Descriptor, Slab
from tpusim.engine.loop cimport Clock, Steps
from tpusim.engine.staging cimport StagingMemory


cdef class PieceRun(Steps):  # (not final: Cython refuses a final subclass overriding proceed)
    cdef public Clock env
    cdef public StagingMemory staging
    cdef public HbmServer hbm
    cdef public list queue
    cdef public tuple pieces
    cdef public dict by_phase, exposed_by_family
    cdef public object resume, desc, phase
    cdef public long run, at, waited, stage, ahead, op_at, op_end
    cdef public bint run_ahead, phase_set
    cdef public double mxu_busy_s, vpu_busy_s, phase_s, wait_start, exposed_dma_s, op_start
    cdef public list rows, op_times
    cdef public dict joins, consumed

    cpdef long start(self, tuple row, phase)

    cpdef long start_ops(self, list rows, long at, long end)

    @cython.locals(staging=StagingMemory)
    cpdef void enter_op(self, tuple row)

    @cython.locals(env=Clock, row=tuple, staging=StagingMemory, slab=Slab, at=long)
    cpdef bint next_op(self)

    @cython.locals(env=Clock, pieces=tuple, run=long, at=Py_ssize_t, stage=long, count=Py_ssize_t, piece=tuple,
                   duration=double, stalled=double, desc=Descriptor, w=Py_ssize_t, n=Py_ssize_t, time_s=double,
                   queue=list, staging=StagingMemory, slab=Slab, hbm=HbmServer, head=double, ahead=bint,
                   f=Py_ssize_t, entry=tuple, releases=tuple, writes=tuple)
    cpdef long proceed(self)
