# The C layout of staging.py's StagingMemory in the compiled engine (setup.py; Cython's
# "augmenting .pxd": staging.py stays the source). Admission's counters are C ints and its
# slabs, rings and pools typed (items.pxd), so a slab admitted or freed is C arithmetic.

cimport cython

from tpusim.engine.hbm cimport HbmServer
from tpusim.engine.items cimport Descriptor, Pool, Ring, Slab
from tpusim.engine.loop cimport Clock


@cython.final
cdef class StagingMemory:
    cdef public Clock env
    cdef public object recorder, peak_layer, current_layer, current_op, watch_bytes, crossing
    cdef public object peak_op, peak_holdings, resident
    cdef public long run
    cdef public HbmServer hbm
    cdef public long long used_bytes, peak_bytes
    cdef public double peak_s
    cdef public bint plain

    @cython.locals(touched=list, run=long, slab=Slab, pool=Pool)
    cpdef release_many(self, slabs)

    @cython.locals(order=list, first=long, ptr=long, plain=bint, run=long, slab=Slab, ring=Ring,
                   used=cython.longlong, hbm=HbmServer, in_flight=long, copies=long, now=double,
                   elapsed=double, start_s=double, at=long, desc=Descriptor, queue=list, group=list)
    cpdef _fill(self, Pool pool)

    @cython.locals(run=long, pool=Pool, ptr=long, waiting=Slab)
    cpdef free(self, Slab slab)

    cpdef resolve(self, Slab slab)
