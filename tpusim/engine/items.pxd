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
    cdef public list descs
    cdef public object family, label, layer
    cdef public long free_on_land, freed, released, seq, op_index
    cdef public long long nbytes
    cdef public Pool pool
    cdef public Ring ring


cdef class Descriptor:
    cdef public object chunk, family, tensor, layer, waiter, stream
    cdef public Slab slab, frees_slab
    cdef public bint write
    cdef public long landed, lane, seq
    cdef public long long nbytes
    cdef public double issue_s, land_s, target
