"""servegym: a Gymnasium control environment for designing LLM-serving schedulers.

Importing the package registers ``servegym/Serving-v0``.
"""

from gymnasium.envs.registration import register, registry

__version__ = "0.1.0"

ENV_ID = "servegym/Serving-v0"

if ENV_ID not in registry:
    register(id=ENV_ID, entry_point="servegym.envs.mixture:make_serving_env", max_episode_steps=20_000)

__all__ = ["ENV_ID", "__version__"]
