"""The helper families, one module each (engine/helpers/base.py's Helper): `matches(config)` says whether a folder's
config.json is one of its models, `load(folder, name)` loads it. Tried in this order; docs/extending.md says how
to add one."""

FAMILIES = (
    "decoder_embed",
)
