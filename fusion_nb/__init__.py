"""A notebook-first, reproducible companion to five model-fusion papers

Modules:

- `fusion_nb.reproduce.hf_merge`: `fusion-nb merge` for causal LMs, LLaVA, CLIP and encoders: mergekit's YAML configs as they are, tensor by tensor from (sharded) safetensors into sharded safetensors with an index, the base's config and tokenizer copied."""

__version__ = "0.1.0"
