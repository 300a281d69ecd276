"""Packaging for agentrl_verl (the verl plugin) and env_adapters (the environment stack)."""

from setuptools import find_packages, setup

ENV_REQUIRES = [
    "orjson>=3.9",  # JSON on the controller/worker hot path
    "httptools>=0.6",  # HTTP/1.1 parsing (C) under the controller, workers and client (env_adapters/http.py)
    "uvloop>=0.19; sys_platform != 'win32'",  # faster event loop for controller/worker (optional at run time)
    "pydantic>=2.5",
    "pyyaml>=6",
    "docker>=7",
    "pymysql>=1.1",
    "pyoxigraph>=0.5",  # embedded SPARQL store of the kg task
    "nltk>=3.8",  # webshop: Lucene's Porter stemmer (MARTIN_EXTENSIONS); alfworld: upstream's BLEU action matching
    "thefuzz>=0.22",  # webshop: upstream's fuzzy attribute/option matching
]
TRAIN_REQUIRES = [
    "verl==0.9.1",
    # Modules verl 0.9.1 imports at run time (agent loop, trainer, llm server) but does not declare.
    "cachetools",
    "fastapi",
    "uvicorn",
    "pyzmq",
    "msgspec",
    "TransferQueue",
    "pandas",
    "pyarrow",
    "matplotlib",
    "wrapt",  # post-import hooks: the CPU platform patches verl's engines only in processes that import them
]
# The `alfworld` task: ALFWorld's TextWorld engine (builds Fast Downward from source, a few minutes; no THOR/torch
# pieces).
ALFWORLD_REQUIRES = ["alfworld==0.4.2"]
# `agentrl-verl build-model smollm2`: transformers reads the GGUF file of SmolLM2-135M-Instruct through it.
SMOLLM2_REQUIRES = ["gguf>=0.10"]
# `agentrl-env openenv` (and a stack YAML's `openenv` entry): the stack's tasks as an OpenEnv environment; the
# `openenv` task family: an OpenEnv environment as a task.
OPENENV_REQUIRES = ["openenv==0.10.0"]
DOCS_REQUIRES = ["mkdocs>=1.6,<2", "mkdocs-material>=9.5"]  # the documentation site (mkdocs.yml)
TEST_REQUIRES = ["aiohttp>=3.9", "pytest>=8", "pytest-asyncio>=0.23", "pytest-timeout", "pytest-xdist>=3.6",
                 "hypothesis", "ruff", "import-linter>=2.17"]

setup(
    name="agentrl-verl",
    version="0.1.0",
    description="AgentRL (multi-turn, multi-task agentic RL) as a verl plugin, with an AgentBench-FC environment stack",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10,<3.13",
    packages=find_packages(include=["agentrl_verl", "agentrl_verl.*", "env_adapters", "env_adapters.*"]),
    package_data={
        "agentrl_verl": ["presets/*.yaml", "presets/**/*.yaml", "models/templates/*.jinja"],
        "env_adapters": ["data/agentbench/**/*", "data/agentbench/*", "sandbox/images/*", "configs/*.yaml",
                         "tasks/os_interaction/scripts/*/*"],
    },
    include_package_data=True,
    install_requires=ENV_REQUIRES,
    extras_require={
        "env": [],
        "train": TRAIN_REQUIRES,
        "test": TEST_REQUIRES,
        "alfworld": ALFWORLD_REQUIRES,
        "smollm2": SMOLLM2_REQUIRES,
        "openenv": OPENENV_REQUIRES,
        "docs": DOCS_REQUIRES,
        "all": TRAIN_REQUIRES + TEST_REQUIRES + ALFWORLD_REQUIRES + SMOLLM2_REQUIRES + OPENENV_REQUIRES + DOCS_REQUIRES,
    },
    entry_points={
        "console_scripts": [
            "agentrl-env=env_adapters.cli:main",
            "agentrl-verl=agentrl_verl.tools.cli:main",
        ],
        # verl imports every module of this group on `import verl` (also inside each Ray worker).
        "verl.plugins": ["agentrl_verl=agentrl_verl.plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3.10",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
    ],
)
