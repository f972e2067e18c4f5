"""A model whose chat template has no tool syntax: the demo model's weights and tokenizer under SmolLM2-Instruct's
plain ChatML template (which drops tools), for the tests of tools described in the system message."""

from __future__ import annotations

import json
from pathlib import Path

# SmolLM2-135M-Instruct's template, as its tokenizer_config.json has it
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
          "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def plain_chatml_model(demo: Path, folder: Path) -> Path:
    """demo's files linked into folder, its tokenizer_config.json with CHATML and no tool parser named."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in demo.iterdir():
        if f.name != "tokenizer_config.json":
            (folder / f.name).symlink_to(f)
    config = json.loads((demo / "tokenizer_config.json").read_text())
    config.pop("tool_parser_type", None)
    config["chat_template"] = CHATML
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder
