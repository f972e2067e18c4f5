"""Each tool-call format's zoo model: the family's markers, added to the demo tokenizer as its real tokenizer
has them (special or not), and its chat template, from which mlx-lm infers the format as it would for the
real checkpoint (mlx_lm/tokenizer_utils.py `_infer_tool_parser`).

The templates (engine/zoo/templates/) render tools, tool calls and tool results as the family's own
template does; turns stay ChatML where the family frames them otherwise, so every zoo model keeps the
demo tokenizer's end of turn (<|im_end|>) as its EOS.
"""

from __future__ import annotations

from importlib import resources

# (text, special) per format, in the order they are added on top of the demo vocabulary
MARKERS: dict[str, tuple[tuple[str, bool], ...]] = {
    # Qwen3-Coder's <tool_call> is the demo tokenizer's own; <function=...> and <parameter=...> are text.
    "qwen3_coder": (),
    "glm47": (("<arg_key>", False), ("</arg_key>", False), ("<arg_value>", False), ("</arg_value>", False)),
    "kimi_k2": (("<|im_user|>", True), ("<|im_assistant|>", True), ("<|im_system|>", True),
                ("<|im_middle|>", True), ("<|tool_calls_section_begin|>", True),
                ("<|tool_calls_section_end|>", True), ("<|tool_call_begin|>", True),
                ("<|tool_call_argument_begin|>", True), ("<|tool_call_end|>", True)),
    "minimax_m2": (("<minimax:tool_call>", False), ("</minimax:tool_call>", False)),
    "longcat": (("<longcat_tool_call>", False), ("</longcat_tool_call>", False), ("<longcat_arg_key>", False),
                ("</longcat_arg_key>", False), ("<longcat_arg_value>", False), ("</longcat_arg_value>", False)),
    # MiniCPM 5's and Muse Spark's markup is text
    "minicpm5": (),
    "muse_spark": (),
    "pythonic": (("<|tool_list_start|>", True), ("<|tool_list_end|>", True), ("<|tool_call_start|>", True),
                 ("<|tool_call_end|>", True), ("<|tool_response_start|>", True), ("<|tool_response_end|>", True)),
    "gemma4": (("<|tool>", True), ("<tool|>", True), ("<|tool_call>", True), ("<tool_call|>", True),
               ("<|tool_response>", True), ("<tool_response|>", True), ('<|"|>', True)),
    "function_gemma": (("<start_function_declaration>", True), ("<end_function_declaration>", True),
                       ("<start_function_call>", True), ("<end_function_call>", True),
                       ("<start_function_response>", True), ("<end_function_response>", True), ("<escape>", True)),
    "kimi_k3": (("<|open|>", True), ("<|close|>", True), ("<|sep|>", True), ("<|end_of_msg|>", True)),
    "mistral": (("[AVAILABLE_TOOLS]", True), ("[/AVAILABLE_TOOLS]", True), ("[TOOL_CALLS]", True),
                ("[ARGS]", True), ("[TOOL_RESULTS]", True), ("[/TOOL_RESULTS]", True)),
}


def template(fmt: str) -> str:
    """The chat template of format fmt's zoo model."""
    return resources.files(__package__).joinpath("templates", f"{fmt}.jinja").read_bytes().decode("utf-8")
