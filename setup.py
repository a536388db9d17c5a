"""g3mpi: exact full-graph GNN training over MPI (runtime ``g3mpi``) and its data tools (``data_tools``)."""
from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="g3mpi",
    version="0.1.0",
    description="Exact, scalable full-graph GNN training (GCN, GraphSAGE, GAT) over MPI ranks",
    long_description=(Path(__file__).parent / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["g3mpi", "g3mpi.*", "data_tools", "data_tools.*"]),
    install_requires=[
        # an open torch requirement pulls a multi-GB CUDA build; the top of the range is the tested CPU build
        "torch>=2.1,<=2.13.0",
        "numpy>=1.24",
        "scipy>=1.10",
        "pymetis>=2023.1",
        # g3-partition's default (--method auto) partitioner
        "kaminpar>=3.7",
        "h5py>=3.8",
        "mpi4py>=4.0",
        # the MPICH wheel: no system MPI needed (see README for using a cluster's own MPI)
        "mpich>=4.1",
        "tqdm>=4.60",
        "matplotlib>=3.7",
    ],
    extras_require={
        "test": ["pytest>=7", "mpi-pytest>=2025.0", "torch-geometric>=2.5", "scikit-learn>=1.3"],
    },
    entry_points={
        "console_scripts": [
            "g3-prepare=data_tools.cli:prepare_main",
            "g3-partition=data_tools.cli:partition_main",
            "g3-inspect=data_tools.cli:inspect_main",
            "g3-train=g3mpi.cli.train:main",
            "g3-bench=g3mpi.bench.cli:main",
            "g3-sweep=g3mpi.cli.sweep:main",
            "g3-report=g3mpi.cli.report:main",
        ]
    },
)
