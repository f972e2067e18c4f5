"""The rerank dialect: /v1/rerank (and vLLM's /rerank and /v2/rerank), in the shape Cohere's, Jina's and vLLM's
clients share."""
