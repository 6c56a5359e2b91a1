"""How many tokens the common models' context windows hold (issue 30: one 128,000 default
misjudged most of them, both ways).

``window_of("openai/gpt-4.1-mini")`` looks the model's name up without its provider prefix
and an Ollama-style tag (``llama3.1:8b`` → ``llama3.1``), by the longest known prefix, case
aside. A model not listed gets ``DEFAULT_WINDOW``. The figures are the vendors' published
input windows (a model served locally may be given less: say so with ``--context-limit`` or
``context_limit`` in the model's config table, which win over this list).
"""

from __future__ import annotations

from typing import Final

DEFAULT_WINDOW: Final = 128_000

# name prefix -> window in tokens; a longer prefix wins over a shorter one
WINDOWS: Final[dict[str, int]] = {
    # OpenAI
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "o1": 200_000,
    "o1-mini": 128_000,
    "o3": 200_000,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
    "codex-mini": 200_000,
    "gpt-oss": 131_072,
    # Anthropic
    "claude": 200_000,
    # Google (through OpenAI-compatible servers)
    "gemini-1.5": 1_048_576,
    "gemini-2": 1_048_576,
    "gemma2": 8_192,
    "gemma3": 131_072,
    # Meta
    "llama3": 8_192,
    "llama3.1": 131_072,
    "llama3.2": 131_072,
    "llama3.3": 131_072,
    "llama4": 1_048_576,
    "llama-3.1": 131_072,
    "llama-3.3": 131_072,
    # Mistral
    "mistral": 32_768,
    "mistral-large": 131_072,
    "mistral-small": 131_072,
    "mistral-nemo": 131_072,
    "codestral": 262_144,
    "devstral": 131_072,
    "mixtral": 32_768,
    # Qwen
    "qwen2.5": 32_768,
    "qwen2.5-coder": 32_768,
    "qwen3": 40_960,
    "qwen3-coder": 262_144,
    # DeepSeek, Moonshot, Zhipu, Microsoft
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "deepseek-coder": 128_000,
    "deepseek-r1": 131_072,
    "deepseek-v3": 131_072,
    "kimi-k2": 131_072,
    "glm-4": 131_072,
    "phi3": 131_072,
    "phi4": 16_384,
}


def window_of(model: str) -> int:
    """The context window of ``model`` ("provider/name", or a bare name), or ``DEFAULT_WINDOW``."""
    name = model.rsplit("/", 1)[-1].split(":", 1)[0].lower()
    best = ""
    for prefix in WINDOWS:
        if name.startswith(prefix) and len(prefix) > len(best):
            best = prefix
    return WINDOWS[best] if best else DEFAULT_WINDOW
