"""Token shards for language-model pretraining (recipe gpt).

corpus (documents, fingerprint, split) -> tokenizer (byte-level BPE or raw bytes) -> shards
(``.bin`` memmaps + ``manifest.json`` with SHA-256 per file) -> loader (stateful window loaders,
torch: imported on use). ``hpcpipe.data`` re-exports the public names.
"""
