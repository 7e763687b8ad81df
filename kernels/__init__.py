"""Fast paths (``mmspec.kernels``), each beside a readable reference that tests compare against:

- `lean_llama`: a Llama decoder's forward with plain tensor ops, for drafters' many small steps
  (reference: transformers' own `LlamaForCausalLM` / `LlamaDecoderLayer` forward).
"""
