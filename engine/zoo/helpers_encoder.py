"""The zoo's helper models of the encoder and reranker families, written as their real folders are:

- bert-embedding: a sentence-transformers BERT folder (config.json, model.safetensors, a WordPiece tokenizer,
  modules.json with Transformer, Pooling (mean) and Normalize, 1_Pooling/config.json, sentence_bert_config.json);
- bert-rerank: a BertForSequenceClassification cross-encoder with one label (bert.* tensors and a classifier);
- modernbert-embedding, modernbert-rerank: the same two for ModernBERT (local and global attention layers);
- qwen3-reranker: the zoo's Qwen3 with tied embeddings, as Qwen3-Reranker-0.6B has, on the demo tokenizer
  with "yes" and "no" added.

Random weights: they prove plumbing, never quality.
"""

from __future__ import annotations

from pathlib import Path

from engine.modelgen.store import write_json

BERT_VOCAB, BERT_HIDDEN, BERT_LAYERS, BERT_HEADS, BERT_INTERMEDIATE = 512, 64, 2, 4, 128
BERT_POSITIONS, BERT_MAX_SEQ = 128, 96  # max_seq_length below the position table: the folder's own cap wins
MODERNBERT_LAYERS, MODERNBERT_INTERMEDIATE, MODERNBERT_WINDOW = 4, 96, 8
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
POOLING_CONFIG = {"word_embedding_dimension": BERT_HIDDEN, "pooling_mode_cls_token": False,
                  "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
                  "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
                  "pooling_mode_lasttoken": False, "include_prompt": True}
ANSWERS = (("yes", False), ("no", False))
MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
]


def write_wordpiece(out: Path) -> None:
    """A lower-casing WordPiece tokenizer trained offline on the demo corpus, with BERT's [CLS] $A [SEP]
    template, as tokenizer.json, vocab.txt and their configs."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    from engine.modelgen.tokenizer import data

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    trainer = trainers.WordPieceTrainer(vocab_size=BERT_VOCAB, special_tokens=list(SPECIALS), show_progress=False)
    tok.train_from_iterator(data("corpus.txt").splitlines(), trainer=trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    tok.save(str(out / "tokenizer.json"), pretty=False)
    vocab = tok.get_vocab()
    (out / "vocab.txt").write_text("".join(t + "\n" for t in sorted(vocab, key=vocab.get)), encoding="utf-8")
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": BERT_MAX_SEQ,
        "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "mask_token": "[MASK]", "clean_up_tokenization_spaces": False, "tokenize_chinese_chars": True})
    write_json(out / "special_tokens_map.json", {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                                                 "unk_token": "[UNK]", "mask_token": "[MASK]"})


def bert_config(vocab: int, classifier: bool) -> dict:
    """A config.json with the keys a real BERT checkpoint's has, shrunk."""
    return {
        "architectures": ["BertForSequenceClassification" if classifier else "BertModel"],
        "model_type": "bert", "vocab_size": vocab, "hidden_size": BERT_HIDDEN, "num_hidden_layers": BERT_LAYERS,
        "num_attention_heads": BERT_HEADS, "intermediate_size": BERT_INTERMEDIATE, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "max_position_embeddings": BERT_POSITIONS,
        "type_vocab_size": 2, "initializer_range": 0.02, "layer_norm_eps": 1e-12, "pad_token_id": 0,
        "position_embedding_type": "absolute", "use_cache": True, "classifier_dropout": None,
        "torch_dtype": "float32",
    } | ({"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}} if classifier else {})


def modernbert_config(vocab: int, classifier: bool) -> dict:
    """A config.json with the keys answerdotai/ModernBERT-base's has (its older RoPE keys), shrunk: four layers,
    so two are local, and a local window of 8 tokens that short inputs already exceed."""
    return {
        "architectures": ["ModernBertForSequenceClassification" if classifier else "ModernBertModel"],
        "model_type": "modernbert", "vocab_size": vocab, "hidden_size": BERT_HIDDEN,
        "num_hidden_layers": MODERNBERT_LAYERS, "num_attention_heads": BERT_HEADS,
        "intermediate_size": MODERNBERT_INTERMEDIATE, "hidden_activation": "gelu",
        "max_position_embeddings": BERT_POSITIONS, "norm_eps": 1e-5, "norm_bias": False,
        "global_rope_theta": 160000.0, "local_rope_theta": 10000.0, "global_attn_every_n_layers": 3,
        "local_attention": MODERNBERT_WINDOW, "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "embedding_dropout": 0.0, "mlp_dropout": 0.0, "initializer_range": 0.02,
        "pad_token_id": 0, "cls_token_id": 2, "sep_token_id": 3, "bos_token_id": 2, "eos_token_id": 3,
        "classifier_pooling": "mean", "classifier_activation": "gelu", "classifier_bias": False,
        "classifier_dropout": 0.0, "tie_word_embeddings": True, "torch_dtype": "float32",
    } | ({"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}} if classifier else {})


def _tensors(model, family: str) -> dict:
    """Every tensor of `model`, drawn by name: matrices scaled by fan-in, LayerNorm scales near one, biases small."""
    import math

    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.modelgen.draws import uniform

    tensors = {}
    for name, p in tree_flatten(model.parameters()):
        shape, key = tuple(p.shape), f"{family}/{name}"
        if "norm" in name.lower() and name.endswith("weight"):
            value = uniform(key, shape, 0.1, low=0.8)
        elif name.endswith("bias"):
            value = uniform(key, shape, 0.05)
        elif "embeddings" in name:
            value = uniform(key, shape, 1.0)
        else:
            value = uniform(key, shape, 1.0 / math.sqrt(shape[-1]))
        tensors[name] = mx.array(value)
    return tensors


def _encoder(out: Path, family: str, classifier: bool) -> dict:
    """An encoder folder: the bare model with sentence-transformers' files (an embedder), or a *ForSequenceClassification
    checkpoint with one label (a cross-encoder), its encoder under the class's prefix."""
    import mlx.core as mx

    from engine.helpers.bert import ENCODER_TYPES, Bert
    from engine.helpers.modernbert import ModernBert

    write_wordpiece(out)
    vocab = len((out / "vocab.txt").read_text(encoding="utf-8").splitlines())
    labels = 1 if classifier else 0
    if family == "bert":
        config = bert_config(vocab, classifier)
        model = Bert(config, pooler=True, labels=labels)
    else:
        config = modernbert_config(vocab, classifier)
        model = ModernBert(config, labels=labels)
    tensors = _tensors(model, family)
    if classifier:  # the head's own tensors sit beside the encoder's prefix
        heads = ("classifier.", "head.")
        prefix = ENCODER_TYPES[family]
        tensors = {(n if n.startswith(heads) else prefix + n): v for n, v in tensors.items()}
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(tensors.items())), metadata={"format": "pt"})
    write_json(out / "config.json", config)
    if not classifier:
        write_json(out / "modules.json", MODULES)
        (out / "1_Pooling").mkdir()
        write_json(out / "1_Pooling" / "config.json", POOLING_CONFIG)
        (out / "2_Normalize").mkdir()
        write_json(out / "sentence_bert_config.json", {"max_seq_length": BERT_MAX_SEQ, "do_lower_case": False})
    return {"model_type": family, "vocab_size": vocab}


def _qwen3_reranker(out: Path) -> dict:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.utils import save_config

    from engine.modelgen.tokenizer import ENDOFTEXT, IM_END, quiet_ids, write_tokenizer
    from engine.zoo.configs import CONTEXT_LENGTH, HIDDEN, config
    from engine.zoo.store import FILLER_WORDS, VOCAB
    from engine.zoo.weights import build

    # The demo corpus teaches no "yes" or "no" token: they go on top, after the demo's ids.
    vocab = write_tokenizer(out, VOCAB, FILLER_WORDS, CONTEXT_LENGTH, extra=ANSWERS)
    cfg = config("qwen3", len(vocab), vocab[IM_END], vocab[ENDOFTEXT]) | {"tie_word_embeddings": True}
    model, cfg = build(cfg, HIDDEN, quiet_ids(vocab), quantized=False)
    mx.save_safetensors(str(out / "model.safetensors"), dict(sorted(tree_flatten(model.parameters()))),
                        metadata={"format": "mlx"})
    save_config(cfg, out / "config.json")
    return {"model_type": "qwen3", "vocab_size": len(vocab)}


MODELS = ("bert-embedding", "bert-rerank", "modernbert-embedding", "modernbert-rerank", "qwen3-reranker")


def generate(name: str, out: Path) -> dict:
    """Write zoo helper `name` into the existing directory `out`; return its marker (without the version)."""
    if name == "qwen3-reranker":
        return {"name": name, "kind": "rerank"} | _qwen3_reranker(out)
    family, kind = name.split("-")
    return {"name": name, "kind": kind} | _encoder(out, family, classifier=kind == "rerank")
