"""The helper families, one module each (engine/helpers/base.py's Helper): `matches(config)` says whether a folder's
config.json is one of its models, `load(folder, name)` loads it. Tried in this order; docs/extending.md says how
to add one."""

FAMILIES = (
    "decoder_embed",  # Qwen3-Embedding style: a causal LM's last token
    "encoder",  # BERT, RoBERTa, XLM-RoBERTa, ModernBERT: sentence-transformers pooling
    "rerank",  # Qwen3-Reranker style (P(yes) at the card's prompt) and one-label cross-encoders
)
