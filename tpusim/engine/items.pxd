# The C layout of items.py's state classes in the compiled engine (setup.py; Cython's
# "augmenting .pxd": items.py stays the source and runs unchanged where not compiled). The
# fields the event loop reads by the thousand are C ints and doubles, read without the
# object protocol; the rest stay Python objects. ``public``: the interpreted modules that build
# and read them (lowering, build, core, reuse) see ordinary attributes.

cdef class Ring:
    cdef public object name
    cdef public long depth, used


cdef class Pool:
    cdef public object name, members
    cdef public double capacity_bytes  # an int arena size, or inf (compared exactly below 2**53)
    cdef public list order
    cdef public long ptr
    cdef public long long used_bytes


cdef class Slab:
    # (the fields a run reads and sets first, next to the object's header: fewer cache lines a
    # slab, which the run touches once or twice; K3 at batch 8 holds 4,000 of them)
    cdef public Ring ring
    cdef public Pool pool
    cdef public list descs
    cdef public long released, freed, free_on_land
    cdef public long long nbytes
    cdef public object family, label, layer
    cdef public long seq, op_index


cdef class Descriptor:
    # (as Slab: the fields a run reads and sets first; 10,000 copies at batch 8)
    cdef public long landed, seq
    cdef public long long nbytes
    cdef public double target, land_s
    cdef public object waiter
    cdef public Slab slab, frees_slab
    cdef public object chunk, family, tensor, layer, stream
    cdef public bint write
    cdef public long lane
    cdef public double issue_s
