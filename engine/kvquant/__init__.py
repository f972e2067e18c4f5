"""KV-cache quantization (KV_BITS, KV_GROUP_SIZE): batched quantized caches and which cache kinds take them.

engine/kvquant/cache.py holds the caches (rotating.py the sliding windows'), engine/kvquant/kinds.py the decision
per model that `launch.sh check` and the engine share (engine/kvquant/preflight.py asks it for check);
docs/kv-quantization.md says what is covered.
"""
