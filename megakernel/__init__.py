"""The Pallas megakernel for a whole Kimi K3 decode step, its pure-JAX reference and layout.

Modules, bottom up:

- math: :mod:`~megakernel.quant` (FP8 / MXFP4 / E8M0 codecs), :mod:`~megakernel.math_common`,
  :mod:`~megakernel.math_kda`, :mod:`~megakernel.math_mla`, :mod:`~megakernel.math_moe`,
  :mod:`~megakernel.residual` — pure functions shared by reference and kernel;
- :mod:`~megakernel.dims` (per-device widths, checked against :mod:`tpusim.workload.shapes`),
  :mod:`~megakernel.layout` (weights in real formats: random or safetensors),
  :mod:`~megakernel.reference` (the decode step in plain JAX);
- :mod:`~megakernel.dma_plan` (schedule -> rings, arenas, issue points; refusals in
  :mod:`~megakernel.errors`), :mod:`~megakernel.ring_pool` (a ring-mode pool's banks, read
  from the simulator's issue plan), :mod:`~megakernel.hbm` (weights -> the 16-bit word slabs
  the kernel streams);
- the kernel: :mod:`~megakernel.kernel` (assembly, prologue/windows); its context ``Ctx``
  (:mod:`~megakernel.kernel_dma`) joins refs, tables and the trace-time cache
  (:mod:`~megakernel.kernel_refs`), control flow (:mod:`~megakernel.kernel_control`), copies
  (:mod:`~megakernel.kernel_dma`) and streamed products (:mod:`~megakernel.kernel_products`);
  the ops: :mod:`~megakernel.kernel_attention`, :mod:`~megakernel.kernel_moe`, running the op
  bodies of :mod:`~megakernel.layer_ops` (a layer's math, written once for this kernel and the
  multi-device decode);
- :mod:`~megakernel.events` (recorded and planned event orders), :mod:`~megakernel.runner`
  (``tpusim run-kernel``), :mod:`~megakernel.examples`, :mod:`~megakernel.chip_numerics` and
  :mod:`~megakernel.reference_spread` (the numerics yardsticks);
- :mod:`~megakernel.reference_jnp`: the decode step written again without the math modules
  above (the independent check of the kernel's math);
- several devices: :mod:`~megakernel.collective_plan` (the plan's messages and the
  simulator's issue/consume points as kernel tables), :mod:`~megakernel.multi_device` (the
  collective program as remote copies under ``shard_map``); the K3 decode across
  devices: :mod:`~megakernel.decode_shards` (each device's shard of the full weights),
  :mod:`~megakernel.multi_device_decode` and :mod:`~megakernel.decode_ops` (the decode with
  the collectives carrying its partials and gathers), :mod:`~megakernel.decode_ties`
  (routing near ties against the reference), :mod:`~megakernel.tolerance`;
- the top: :mod:`~megakernel.commands`, this layer's command-line tools: its ``tpusim``
  commands (``run-kernel``, ``lower``, the Mosaic check of ``tpusim sweep --compile-check``),
  found by the command line through entry points (:mod:`tpusim.app.plugins`), and the
  ``python -m megakernel.commands.NAME`` checks that run in a fresh process (``race_check``,
  ``multi_device_check``, ``decode_check``, ``collective_check``, ``lower_check``,
  ``mosaic_compile``, ``chip_numerics``, ``reference_spread``). No module outside it has a
  ``__main__``.

Simplifications relative to ``shared/reference/kimi-k3.md`` (docs/megakernel.md lists them too):

1. KDA decay gate: ``g = -5 * sigmoid(exp(A_log) * (f + dt_bias))`` (bounded in (-5, 0)),
   our choice of a gate with K3's lower bound; q, k L2-normalised, SiLU after the conv on
   q, k, v; output gate = per-head RMSNorm (no weight) times sigmoid(gate).
2. MLA: absorbed attention, RoPE rotate-half with base 10000; q/kv RMSNorms on the LoRA
   latents; the cache stores the normed latent and the roped key (bf16). All rows of a batch
   share one position.
3. Attention residuals: our formulation (see :mod:`megakernel.residual`): softmax over
   ``rmsnorm(source) . query`` per sublayer with sources = embedding, completed 12-layer block
   sums and the running partial sum; the head reads the plain residual sum.
4. The final norm weight is folded into ``lm_head`` (no separate parameter in tpusim.workload.shapes);
   the embedding gather runs in XLA before the ``pallas_call``.
5. Weights are random (seeded) unless loaded from safetensors with our tensor names; the
   FP8 gate/up blocks are quantised directly (not re-blocked from an MXFP4 checkpoint).
6. The decode kernel is single-device: collectives are omitted. At the K3 TP32 per-device
   sizes (lowering only) the latent all-gather, MoE output all-gather and router exchange
   are replaced by stand-ins (:mod:`megakernel.dims`); routing scores the device's own 112
   experts. The plan's collectives with the model's activations run in
   :mod:`megakernel.multi_device_decode`, whose weights are per-layer VMEM operands rather
   than the schedule's HBM streams.
7. Scheduling rules the kernel adds to the schedule contract (:mod:`megakernel.dma_plan`):
   a prefetch distance never reaches back past a ``moe.topk`` whose expert count it spans;
   small parameters never share a pool; ``mla.kv_b`` is never chunked; expert_issue
   ``speculative`` is not implemented; in a ring pool a slab must fit a bank and the tensors
   one op reads must fit the banks together; ``max_dmas_in_flight`` is reported, not enforced.
"""
