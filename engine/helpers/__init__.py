"""Helper models beside the served one: an embedding model (EMBEDDING_MODEL) and a reranker (RERANK_MODEL),
loaded on rank 0, outside the big model's lockstep plan (docs/helpers.md)."""
