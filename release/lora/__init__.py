"""Folding PEFT LoRA adapters into base checkpoints, bit for bit as peft 0.21's `merge_and_unload`.

settings.py   adapter_config.json: supported options, refusals, rank/alpha patterns
adapter.py    match the adapter's tensors with the base tensors they change (headers only)
fold.py       peft's merge arithmetic, op for op (torch)
tensor_io.py  byte-range reads and writes, kernel copies for untouched bytes
shards.py     write one merged shard, one tensor in memory at a time
The stage entry point is release.stages.merge.merge_checkpoint.
"""
