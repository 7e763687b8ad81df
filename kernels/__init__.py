"""Fast paths (``mmspec.kernels``), each beside a readable reference that tests compare against:

- `lean_llama`: a Llama decoder's forward with plain tensor ops, for drafters' many small steps
  (reference: transformers' own `LlamaForCausalLM` / `LlamaDecoderLayer` forward).
- `int8_linear`: weight-only int8 copies of linear layers for drafting on a CPU (reference: `F.linear`).
- `certified_head`: a verification's greedy choices from a bfloat16 product of the output head, exact
  through a rounding bound (reference: the float32 head's argmax).
- `rejection`: chain verification in one Triton program per row: greedy matching and speculative sampling,
  with inputs that run relaxed rules (LANTERN, GSD) too (references: `*_reference` beside each dispatcher).
- `tree_verify`: draft-tree verification in one Triton program per tree: greedy path matching and recursive
  rejection sampling over siblings (references as above).
"""
