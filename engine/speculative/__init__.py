"""Speculative decoding in lockstep: rank 0 proposes, every rank verifies the proposals in one forward pass.

How the pieces fit (each in its own module of this package):

- A proposer runs on rank 0 only and never needs another rank: `ngram` (prompt lookup over the sequence's prompt
  and output), `draft` (a small model of the same tokenizer, held by rank 0 alone), `mtp` (the target model's own
  multi-token-prediction heads, where mlx-lm loads them). SPECULATIVE picks one, NUM_DRAFT_TOKENS caps its
  proposals per sequence and step.
- Proposals travel in the step plan (`Plan.drafts`: request id -> draft tokens), like every other decision, so
  every rank verifies exactly the same ones. A proposal continues a sequence's next input token, which is known
  only once the previous step has sampled it: while any sequence gets drafts, rank 0 makes plan n+1 after step n
  instead of sending it ahead.
- Verification (`LockstepBatch.step(drafts)`): one forward pass over [next input, d1..dk] for every decoding
  sequence of the batch at once (sequences without drafts are padded and keep one token); each sequence accepts
  its own prefix of its drafts (greedy: while the target's choice equals the draft; sampled: standard speculative
  sampling acceptance, so the output keeps the target distribution, with keys derived from the request's seed and
  token index so seeded output is reproducible), then gains one more token sampled by the target. The KV of its
  rejected drafts is rolled back per sequence. Logits processors (penalties, bias, the grammar mask) see each
  position's context, so a draft the grammar forbids is never accepted. Stop tokens and max_tokens end a sequence
  at the first token that ends it, accepted drafts after it discarded.
- Every rank computes the same acceptances from the same logits, and the token checksum of the next plan covers
  every token gained, so ranks cannot diverge silently.
- A linear-attention layer (ArraysCache: Qwen3.5, Qwen3-Next) keeps no tokens to drop: the verify pass records its
  state after every position (`linear`), and each sequence keeps the one after its last kept token.
- A model whose caches cannot roll back a suffix per sequence (sliding-window RotatingKVCache, an ArraysCache of
  layers `linear` cannot record) decodes plainly, with one log line at start saying why.
- StepResults count proposed and accepted draft tokens; Info, /metrics (`mcs_spec_proposed_tokens_total`,
  `mcs_spec_accepted_tokens_total`), /health, status and the dashboard report them with tokens per forward pass.
"""
