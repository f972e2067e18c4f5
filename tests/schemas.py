"""Tool schemas the integration tests share: the same get_weather parameters across dialects and formats."""

from __future__ import annotations


def weather_schema(**more: dict) -> dict:
    """get_weather's parameters: a closed object with a city of three and 1-7 days, both required.

    `more` adds optional properties after those two (a unit, a note), for tests that need a free string or
    an enum the model may leave out.
    """
    return {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            **more,
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    }


WEATHER = weather_schema()
UNIT = {"type": "string", "enum": ["celsius", "fahrenheit"]}
