"""LongCat's format: GLM-4.7's with markers of its own,
`<longcat_tool_call>NAME<longcat_arg_key>KEY</longcat_arg_key><longcat_arg_value>VALUE</longcat_arg_value>...</longcat_tool_call>`."""

from engine.toolformats.glm47 import ArgKeyValue

FORMAT = ArgKeyValue("longcat", "longcat_")
