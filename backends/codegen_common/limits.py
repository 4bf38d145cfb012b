"""The codegen limits and defaults that the gateway and the stages share: one definition of each, here, where
Triton's stubs can import it (the gateway imports this module alone of backends/: pyproject.toml's contracts).
Nothing but constants: importing it pulls in no stage code."""

DEFAULT_MAX_TOKENS = 16  # as OpenAI, when neither max_tokens nor sampling_parameters give one
MAX_LOGPROBS = 20  # alternatives per token: the most any engine gives (gptj_generator/seam.py)
