"""Rerankers: relevance of a document to a query, in [0, 1].

- Qwen3-Reranker style (a Qwen3 causal LM, loaded with mlx-lm's classes): the pair goes into the prompt its
  model card writes, and the score is softmax over the logits of "yes" and "no" at the last position, P(yes).
- Cross-encoders (Bert/XLMRoberta/ModernBertForSequenceClassification with one label, e.g. ms-marco-MiniLM,
  bge-reranker-v2-m3, gte-reranker-modernbert): [CLS] query [SEP] document [SEP] through the encoder, sigmoid
  of the logit, as sentence-transformers' CrossEncoder gives it.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx

from engine.helpers import bert
from engine.helpers.families.encoder import load_network, load_tokenizer
from engine.helpers.st_folder import pools_embeddings
from engine.load_errors import ModelError

KIND = "rerank"
# The Qwen3-Reranker card's prompt: its system prefix, the user turn's format, the assistant's empty think block.
PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
          "provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n")
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
PAIR_FORMAT = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
# The card's max_length for a whole scored input.
CARD_MAX_LENGTH = 8192
DECODER_TYPES = ("qwen3",)


def matches(config: dict) -> bool:
    return config.get("model_type") in DECODER_TYPES or (bert.is_encoder(config) and bert.is_classifier(config))


def load(folder: Path, name: str):
    config = bert.read_config(folder)
    if bert.is_encoder(config):
        return CrossEncoder(folder, name, config)
    return DecoderReranker(folder, name, config)


class _Reranker:
    kind = "rerank"
    dimensions = 0
    matryoshka = False

    def tokenize(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def embed(self, batch: list[list[int]]) -> mx.array:
        raise NotImplementedError("a reranker makes no embeddings")

    def weight_bytes(self) -> int:
        return bert.weight_bytes(self.model)


class DecoderReranker(_Reranker):
    """engine.helpers.base.Helper for a Qwen3-Reranker-style causal LM."""

    def __init__(self, folder: Path, name: str, config: dict):
        from mlx_lm.utils import load_model

        if pools_embeddings(folder):  # Qwen3-Embedding shares the architecture and the "yes"/"no" tokens
            raise ModelError(f"{folder} is an embedding model (its modules.json pools token embeddings), not a "
                             "reranker: set it as EMBEDDING_MODEL, and RERANK_MODEL to a reranker")
        self.name = name
        self.model, _ = load_model(folder)
        self.tokenizer = load_tokenizer(folder)
        self.prefix = self.tokenizer.encode(PREFIX, add_special_tokens=False)
        self.suffix = self.tokenizer.encode(SUFFIX, add_special_tokens=False)
        vocab = self.tokenizer.get_vocab()
        missing = [t for t in ("yes", "no") if t not in vocab]
        if missing:
            raise ModelError(f"the tokenizer of {folder} has no token {missing[0]!r}, which a Qwen3-Reranker-style "
                             "model answers with; set RERANK_MODEL to a reranker, not a chat or embedding model")
        self.yes, self.no = vocab["yes"], vocab["no"]
        self.max_tokens = min(CARD_MAX_LENGTH, config.get("max_position_embeddings") or CARD_MAX_LENGTH)
        self.pad_id = self.tokenizer.pad_token_id or 0

    def pair_tokens(self, query: str, document: str, instruction: str | None = None,
                    limit: int | None = None) -> list[int]:
        """The card's input for one pair; `limit` cuts the document's end (the card's truncation) so the
        whole input fits in that many tokens."""
        text = PAIR_FORMAT.format(instruction=instruction or DEFAULT_INSTRUCTION, query=query, document=document)
        middle = self.tokenizer.encode(text, add_special_tokens=False)
        if limit is not None:
            middle = middle[:max(0, limit - len(self.prefix) - len(self.suffix))]
        return self.prefix + middle + self.suffix

    def score(self, batch: list[list[int]]) -> mx.array:
        # Right-padded: a causal model's position i never sees what follows, so padding changes nothing
        # before each row's own last token, whose hidden state alone is read.
        ids, lengths = bert.padded(batch, self.pad_id)
        hidden = self.model.model(ids)
        last = hidden[mx.arange(ids.shape[0]), lengths - 1]
        logits = self._head(last).astype(mx.float32)
        return mx.sigmoid(logits[:, self.yes] - logits[:, self.no])  # = softmax([no, yes])[1]

    def _head(self, hidden: mx.array) -> mx.array:
        if "lm_head" in self.model:  # untied (the 4B and 8B rerankers); the 0.6B ties it to the embeddings
            return self.model.lm_head(hidden)
        return self.model.model.embed_tokens.as_linear(hidden)


class CrossEncoder(_Reranker):
    """engine.helpers.base.Helper for a one-label sequence classifier over a BERT-style encoder."""

    def __init__(self, folder: Path, name: str, config: dict):
        labels = config.get("num_labels") or len(config.get("id2label") or {0: ""})
        if labels != 1:
            raise ModelError(f"{folder / 'config.json'} has {labels} labels; a cross-encoder reranker gives one "
                             "relevance logit: serve a one-label model (ms-marco-MiniLM, bge-reranker)")
        self.name = name
        self.model = load_network(folder, config, labels=1)
        self.tokenizer = load_tokenizer(folder)
        self.max_tokens = config["max_position_embeddings"] - bert.position_offset(config)
        self.pad_id = config.get("pad_token_id") or 0
        self.sep_id = self.tokenizer.sep_token_id
        self.type_vocab = config.get("type_vocab_size", 2)

    def pair_tokens(self, query: str, document: str, limit: int | None = None) -> list[int]:
        """[CLS] query [SEP] document [SEP] as the folder's tokenizer joins a pair; `limit` cuts the document's end
        only (the query is kept whole: the caller refuses a query that leaves no room)."""
        if limit is None:
            return self.tokenizer(query, document)["input_ids"]
        return self.tokenizer(query, document, truncation="only_second", max_length=limit)["input_ids"]

    def score(self, batch: list[list[int]]) -> mx.array:
        ids, lengths = bert.padded(batch, self.pad_id)
        types = bert.token_types(ids, self.sep_id, self.type_vocab)
        logits = self.model.classify(self.model(ids, types, lengths), lengths).astype(mx.float32)
        return mx.sigmoid(logits[:, 0])
