"""The random 8B-shaped benchmark model's tokenizer: padded to the config's vocabulary with pieces of its own,
so every id a random model samples decodes, and nothing it encoded before changes."""

from bench.random_checkpoint import pad_vocab


def test_padding_reaches_the_size_with_new_distinct_pieces_and_keeps_every_old_id():
    vocab = {"a": 0, "b": 1, "aaaa": 2, "<|im_end|>": 3}
    tok = pad_vocab({"model": {"vocab": dict(vocab)}, "added_tokens": [{"id": 3, "content": "<|im_end|>"}]}, 40)
    padded = tok["model"]["vocab"]
    assert len(padded) == 40
    assert sorted(padded.values()) == list(range(40))
    assert all(padded[piece] == idx for piece, idx in vocab.items())
    assert all(len(piece) >= 4 and piece.isalpha() for piece in set(padded) - set(vocab))
