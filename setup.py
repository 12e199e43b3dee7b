"""rljax: reinforcement-learning post-training of language models in JAX/Flax."""
from setuptools import find_packages, setup

setup(
    name="rljax",
    version="0.1.0",
    description="Composable RL post-training for language models in JAX/Flax",
    packages=find_packages(include=["rljax", "rljax.*"]),
    python_requires=">=3.10",
    install_requires=[
        "jax>=0.7",
        "flax>=0.11",
        "optax>=0.2.5",
        "orbax-checkpoint>=0.11",
        "chex>=0.1.89",
        "ml_collections>=1.0",
        "transformers>=4.50",
        "safetensors>=0.4",
        "tokenizers>=0.20",
        "numpy>=1.26",
        "tqdm>=4.66",
        "tensorboardX>=2.6",
        "matplotlib>=3.8",
        "math-verify>=0.7",
        "absl-py>=2.0",
    ],
    extras_require={
        "test": ["pytest>=8", "pytest-xdist>=3.6", "torch==2.13.0", "datasets>=3.0", "pillow>=10", "nbclient>=0.10", "nbformat>=5.10",
                 "ipykernel>=6.29"],
        "hf": ["torch==2.13.0", "datasets>=3.0"],
        # Prompts with images (rljax/data/images.py): decoding files and base64, and the Hugging
        # Face image processors (their PIL backend).
        "vision": ["pillow>=10"],
        "tpu": ["jax[tpu]"],
        "gpu": ["jax[cuda12]"],
        # Experiment trackers (train.loggers): W&B, and MLflow's tracking client.
        "wandb": ["wandb>=0.19.10"],
        "mlflow": ["mlflow-skinny>=3.0"],
        # data.source='reasoning_gym:NAME': reasoning-gym's procedural tasks and their scorers.
        "reasoning_gym": ["reasoning-gym>=0.1.25"],
        # The agent endpoint's demo harnesses (rljax/agents/calc_agent.py): the OpenAI client.
        "agents": ["openai>=2.7"],
        # OpenEnv environments played through the agent endpoint (rljax/agents/openenv_agent.py):
        # the WebSocket client; the server runs with the openenv package in its own environment
        # (the bootstrap makes .venv-openenv for the tests' example server).
        "openenv": ["websockets>=13"],
        # benchmarks/train_step.py's second peer: TRL's GRPOTrainer (CPU).
        "bench": ["torch==2.13.0", "trl==1.16.0", "datasets>=3.0"],
        # LoRA adapters in PEFT's format: rljax writes and reads them without peft; the tests
        # check them against peft + transformers (torch).
        "peft": ["peft==0.21.2", "torch==2.13.0"],
    },
    entry_points={"console_scripts": ["rljax=rljax.cli:entry"]},
)
